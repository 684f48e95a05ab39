package expiring

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

func TestSet(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	s := NewSet[string](clk, time.Minute)
	steps := []struct {
		name    string
		do      func()
		a, b, c bool // Has("a"), Has("b"), Has("c") afterwards
	}{
		{name: "empty", do: func() {}},
		{name: "a added", do: func() { s.Add("a") }, a: true},
		{name: "b added 30s later", do: func() { clk.Step(30 * time.Second); s.Add("b") }, a: true, b: true},
		{name: "a expired at its ttl", do: func() { clk.Step(30 * time.Second) }, b: true},
		{name: "b added again renews it", do: func() { clk.Step(20 * time.Second); s.Add("b") }, b: true},
		{name: "b still a member past its first ttl", do: func() { clk.Step(50 * time.Second) }, b: true},
		{name: "c added, b deleted", do: func() { s.Add("c"); s.Delete("b") }, c: true},
		{name: "all expired", do: func() { clk.Step(time.Minute) }},
	}
	for _, st := range steps {
		st.do()
		if got := [3]bool{s.Has("a"), s.Has("b"), s.Has("c")}; got != [3]bool{st.a, st.b, st.c} {
			t.Errorf("%s: Has(a, b, c) = %v, want %v", st.name, got, [3]bool{st.a, st.b, st.c})
		}
	}
}
