package controlplane

import "testing"

func TestKubernetesVersion(t *testing.T) {
	pinned := map[string]string{"KUBERNETES_VERSION": "v1.37.2", "KUBERNETES_COMPAT_VERSION": "v1.33.13", "ETCD_VERSION": "v3.7.3"}
	noCompat := map[string]string{"KUBERNETES_VERSION": "v1.37.2", "ETCD_VERSION": "v3.7.3"}
	tests := []struct {
		name     string
		versions map[string]string
		env      string
		want     string
		wantErr  bool
	}{
		{name: "unset: the main version", versions: pinned, want: "v1.37.2"},
		{name: "the main version asked for", versions: pinned, env: "v1.37.2", want: "v1.37.2"},
		{name: "the compat version", versions: pinned, env: "v1.33.13", want: "v1.33.13"},
		{name: "a version not pinned", versions: pinned, env: "v1.34.4", wantErr: true},
		{name: "no compat version pinned", versions: noCompat, env: "v1.33.13", wantErr: true},
		{name: "no compat version pinned, empty asked for", versions: noCompat, want: "v1.37.2"},
		{name: "an ETCD version is not a Kubernetes version", versions: pinned, env: "v3.7.3", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := kubernetesVersion(tt.versions, tt.env)
			if (err != nil) != tt.wantErr {
				t.Fatalf("kubernetesVersion(%q) error %v, want error %v", tt.env, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("kubernetesVersion(%q) = %q, want %q", tt.env, got, tt.want)
			}
		})
	}
}

func TestKubernetesMinor(t *testing.T) {
	for v, want := range map[string]int{"v1.37.2": 37, "v1.33.13": 33, "": 0, "v2": 0} {
		if got := (Binaries{KubernetesVersion: v}).KubernetesMinor(); got != want {
			t.Errorf("KubernetesMinor(%q) = %d, want %d", v, got, want)
		}
	}
}
