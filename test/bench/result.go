package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
)

type result struct {
	Machine     machine
	Options     options
	Provisioner string
	Ceiling     ceiling
	// CeilingAfter is the ceiling measured again after the deletion, with
	// the provisioner stopped (not with -binder kcm, whose binder would act
	// on the ceiling's objects). The machine's speed drifts within minutes;
	// the two bracket the run.
	CeilingAfter *ceiling `json:",omitempty"`
	Provision    phase
	Delete       phase
	API          api
	Sidecar      usage
	// CPUPerVolumeMillis is the CPU time each process used while the claims
	// were provisioned and bound, per volume.
	CPUPerVolumeMillis map[string]float64 `json:",omitempty"`
	// SidecarMetrics are the provisioner's own request and write counters
	// after binding (our sidecar only).
	SidecarMetrics map[string]float64 `json:",omitempty"`
	// SidecarMetricsAfterDelete are the same counters once every volume
	// was deleted: DeleteVolume calls and the library's deletion outcomes.
	SidecarMetricsAfterDelete map[string]float64 `json:",omitempty"`
}

type machine struct {
	CPU       string
	CPUs      int
	MemoryGiB float64
	Kernel    string
	Go        string
}

type ceiling struct {
	Volumes          int
	Seconds          float64
	VolumesPerSecond float64
	WritesPerSecond  float64
	// CPUPerVolumeMillis is what each process, the benchmark's writer
	// included, spent per ceiling volume: the machine is the limit, so a
	// run's fraction of the ceiling is about the ratio of the two totals.
	CPUPerVolumeMillis map[string]float64 `json:",omitempty"`
}

type phase struct {
	Seconds           float64
	VolumesPerSecond  float64
	CreateSeconds     float64 `json:",omitempty"`
	FractionOfCeiling float64 `json:",omitempty"`
	// FractionOfCeilingAfter is relative to CeilingAfter.
	FractionOfCeilingAfter float64 `json:",omitempty"`
	// WritesPerSecond counts every write of claims, PVs and events by all
	// clients (the benchmark's creates included) that the API server took
	// (rejected requests left out, see requestKey) during the phase, per
	// second; WriteFractionOfCeiling compares it with the ceiling's
	// WritesPerSecond: near 1, the API server is what limits the phase.
	// Writes after the phase (events still queued when the last claim was
	// Bound) are not part of it; the per-volume counts of [api] wait for
	// them.
	WritesPerSecond        float64 `json:",omitempty"`
	WriteFractionOfCeiling float64 `json:",omitempty"`
	P50, P95, P99          float64 `json:",omitempty"`
	Max                    float64 `json:",omitempty"`
}

type api struct {
	// WritesPerVolume counts PVC and PV creates, updates, status updates and
	// patches per volume that the API server took (a 409 Conflict or a 429
	// changed nothing), excluding the benchmark's own PVC creates.
	WritesPerVolume float64
	// ProvisionerWritesPerVolume counts the object writes of the provisioner
	// process alone: its own client's PUT/DELETE requests plus the PV
	// creates (only a provisioner creates PVs here); its PATCHes are event
	// updates (see provisionerWrites). Zero when the provisioner does not
	// serve client-go's request metrics.
	ProvisionerWritesPerVolume float64 `json:",omitempty"`
	// EventsPerVolume counts event creates and patches per volume that the
	// API server took.
	EventsPerVolume float64
	// PerVolume is every request kind per volume, benchmark's creates
	// excluded; rejected requests are apart, their code in parentheses.
	PerVolume map[string]float64
}

type usage struct {
	CPUSecondsProvision float64
	CPUSecondsTotal     float64
	RSSAfterBindMiB     float64
	PeakRSSMiB          float64
	// PeakAnonMiB is the highest anonymous part of the RSS (heap, stacks),
	// sampled; PeakFileMiB the highest file-backed part (the binary's
	// pages, shared and reclaimable).
	PeakAnonMiB    float64
	PeakFileMiB    float64
	IdleSeconds    float64 `json:",omitempty"`
	IdleCPUPercent float64 `json:",omitempty"`
}

func apiCost(d requestCounts, n int) api {
	a := api{WritesPerVolume: d.volumeWrites() / float64(n), EventsPerVolume: d.events() / float64(n), PerVolume: map[string]float64{}}
	for _, k := range d.sorted() {
		if v := d[k] / float64(n); v >= 0.005 {
			a.PerVolume[k.String()] = v
		}
	}
	return a
}

// printCPU prints one line of CPU milliseconds per volume by process,
// largest first, after their total.
func printCPU(w io.Writer, title string, ms map[string]float64) {
	keys := make([]string, 0, len(ms))
	var total float64
	for k, v := range ms {
		keys = append(keys, k)
		total += v
	}
	sortByValue(keys, ms)
	fmt.Fprintf(w, "%s (%.1f ms in all):", title, total)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s %.2f ms", k, ms[k])
	}
	fmt.Fprintln(w)
}

func printResult(w io.Writer, r *result) {
	fmt.Fprintf(w, "\n== csi-provisioner benchmark: %d claims, binder %s ==\n", r.Options.N, r.Options.Binder)
	fmt.Fprintf(w, "machine: %s, %d CPUs, %.0f GiB, %s, %s\n", r.Machine.CPU, r.Machine.CPUs, r.Machine.MemoryGiB, r.Machine.Kernel, r.Machine.Go)
	fmt.Fprintf(w, "provisioner: %s\n\n", r.Provisioner)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "API server write ceiling\t%.1f volumes/s\t(%.0f writes/s, %d volumes of 5 writes, unthrottled)\n", r.Ceiling.VolumesPerSecond, r.Ceiling.WritesPerSecond, r.Ceiling.Volumes)
	if c := r.CeilingAfter; c != nil {
		fmt.Fprintf(tw, "  measured again after\t%.1f volumes/s\t(%.0f writes/s, with the provisioner stopped)\n", c.VolumesPerSecond, c.WritesPerSecond)
	}
	after := ""
	if r.CeilingAfter != nil {
		after = fmt.Sprintf(", %.0f%% of the one after", 100*r.Provision.FractionOfCeilingAfter)
	}
	fmt.Fprintf(tw, "provision + bind\t%.1f volumes/s\t(%d in %.2fs; %.0f%% of the ceiling%s; creates took %.2fs)\n",
		r.Provision.VolumesPerSecond, r.Options.N, r.Provision.Seconds, 100*r.Provision.FractionOfCeiling, after, r.Provision.CreateSeconds)
	if r.Provision.WritesPerSecond > 0 {
		fmt.Fprintf(tw, "  API server writes\t%.0f/s\t(claims, PVs and events, all clients: %.0f%% of the ceiling's writes/s)\n",
			r.Provision.WritesPerSecond, 100*r.Provision.WriteFractionOfCeiling)
	}
	fmt.Fprintf(tw, "created → Bound latency\tp50 %.3fs\tp95 %.3fs  p99 %.3fs  max %.3fs\n", r.Provision.P50, r.Provision.P95, r.Provision.P99, r.Provision.Max)
	fmt.Fprintf(tw, "delete\t%.1f volumes/s\t(%.2fs until every PV and driver volume was gone)\n", r.Delete.VolumesPerSecond, r.Delete.Seconds)
	if r.Delete.Max > 0 {
		fmt.Fprintf(tw, "claim deleted → PV gone\tp50 %.3fs\tp95 %.3fs  p99 %.3fs  max %.3fs\n", r.Delete.P50, r.Delete.P95, r.Delete.P99, r.Delete.Max)
	}
	fmt.Fprintf(tw, "PVC+PV writes per volume\t%.2f\t(all clients, incl. kube-controller-manager's protection controllers)\n", r.API.WritesPerVolume)
	if r.API.ProvisionerWritesPerVolume > 0 {
		fmt.Fprintf(tw, "  by the provisioner\t%.2f\t(its own client's updates + PV creates; events excluded)\n", r.API.ProvisionerWritesPerVolume)
	}
	fmt.Fprintf(tw, "events per volume\t%.2f\t\n", r.API.EventsPerVolume)
	fmt.Fprintf(tw, "provisioner CPU\t%.1fs\t(%.1fs until all Bound)\n", r.Sidecar.CPUSecondsTotal, r.Sidecar.CPUSecondsProvision)
	fmt.Fprintf(tw, "provisioner RSS\tpeak %.0f MiB\t(%.0f MiB after binding; peak anonymous %.0f MiB + the binary's file pages %.0f MiB)\n",
		r.Sidecar.PeakRSSMiB, r.Sidecar.RSSAfterBindMiB, r.Sidecar.PeakAnonMiB, r.Sidecar.PeakFileMiB)
	if r.Sidecar.IdleSeconds > 0 {
		fmt.Fprintf(tw, "provisioner idle CPU\t%.2f%% of a core\t(over %.0fs with %d bound volumes)\n", r.Sidecar.IdleCPUPercent, r.Sidecar.IdleSeconds, r.Options.N)
	}
	_ = tw.Flush()
	if len(r.CPUPerVolumeMillis) > 0 {
		fmt.Fprintln(w)
		printCPU(w, "CPU per volume while provisioning", r.CPUPerVolumeMillis)
	}
	if len(r.Ceiling.CPUPerVolumeMillis) > 0 {
		printCPU(w, "CPU per volume of the ceiling writer", r.Ceiling.CPUPerVolumeMillis)
	}
	fmt.Fprintln(w, "\nAPI requests per volume while provisioning (benchmark's own PVC creates excluded; rejected ones apart, with their code):")
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	keys := make([]string, 0, len(r.API.PerVolume))
	for k := range r.API.PerVolume {
		keys = append(keys, k)
	}
	sortByValue(keys, r.API.PerVolume)
	for _, k := range keys {
		fmt.Fprintf(tw, "  %s\t%.2f\n", k, r.API.PerVolume[k])
	}
	_ = tw.Flush()
	printCounters(w, "The provisioner's own counters after binding", r.SidecarMetrics)
	printCounters(w, "The same once every volume was deleted", r.SidecarMetricsAfterDelete)
}

func printCounters(w io.Writer, title string, m map[string]float64) {
	if len(m) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s:\n", title)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortByValue(keys, m)
	for _, k := range keys {
		fmt.Fprintf(w, "  %s %.0f\n", k, m[k])
	}
}

func sortByValue(keys []string, m map[string]float64) {
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && (m[keys[j]] > m[keys[j-1]] || (m[keys[j]] == m[keys[j-1]] && keys[j] < keys[j-1])); j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
}

func describeMachine() machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %f kB", &kb); err == nil {
			m.MemoryGiB = kb / (1 << 20)
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	return m
}
