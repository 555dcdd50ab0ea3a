package statefile

import (
	"os"
	"path/filepath"
	"testing"
)

// A write replaces the file whole and leaves no temporary file; a write that cannot happen (here: the
// directory is gone) says so and leaves nothing behind.
func TestWriteReplacesWholeOrFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "birth-seq")
	for _, content := range []string{"41", "42"} {
		if err := Write(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		if data, err := os.ReadFile(path); err != nil || string(data) != content {
			t.Fatalf("file holds %q (%v), want %q", data, err, content)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("directory holds %v, want the file alone", entries)
	}
	if err := Write(filepath.Join(dir, "missing", "f"), []byte("x")); err == nil {
		t.Error("a write into a missing directory succeeded")
	}
}
