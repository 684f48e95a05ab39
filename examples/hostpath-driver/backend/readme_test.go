package backend

import (
	"os"
	"reflect"
	"regexp"
	"strconv"
	"testing"
)

// TestReadmeMethodCount: the driver's README tells driver authors how
// small the Backend interface is; the number must be the real one.
func TestReadmeMethodCount(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("`backend.Backend`, one interface of ([0-9]+) methods").FindSubmatch(b)
	if m == nil {
		t.Fatal("README.md no longer says how many methods backend.Backend has")
	}
	if got, want := string(m[1]), strconv.Itoa(reflect.TypeFor[Backend]().NumMethod()); got != want {
		t.Errorf("README.md says backend.Backend has %s methods; it has %s", got, want)
	}
}
