package desired

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The bounds of what a node's pods may cost the agent (MaxPodBytes, MaxManifestBytes, MaxDesiredBytes,
// MaxWorkers): a tenant's oversized pods cost that tenant's workers their stand-ins, never the agent.

// maxSavedBytes bounds the saved file as read: the workers' JSON within MaxDesiredBytes, and room for the rest.
const maxSavedBytes = MaxDesiredBytes + MaxWorkers*1024

// errSavedTooLarge is a saved file that goes on past maxSavedBytes.
var errSavedTooLarge = fmt.Errorf("larger than %d bytes", maxSavedBytes)

// readSaved reads the saved workers one at a time, never past maxSavedBytes: the workers read before the bound
// are returned with errSavedTooLarge.
func readSaved(r io.Reader) ([]Worker, error) {
	body := &boundedReader{r: r}
	body.allow(maxSavedBytes)
	dec := json.NewDecoder(body)
	if err := expectDelim(dec, '['); err != nil {
		return nil, err
	}
	var list []Worker
	for dec.More() && len(list) < MaxWorkers {
		var wk Worker
		if err := dec.Decode(&wk); err != nil {
			if errors.Is(err, errObjectTooLarge) {
				return list, errSavedTooLarge
			}
			return nil, err
		}
		if len(wk.Manifest) > MaxManifestBytes {
			wk.Manifest, wk.ManifestRefused = "", manifestTooLarge(len(wk.Manifest))
		}
		list = append(list, wk)
	}
	return list, nil
}

// manifestTooLarge says why a worker whose static pod is n bytes gets no stand-in.
func manifestTooLarge(n int) string {
	return fmt.Sprintf("its pod is %d bytes as a static pod, beyond the agent's bound of %d", n, MaxManifestBytes)
}

// bound keeps workers within MaxDesiredBytes: it drops the largest manifests first (each such worker loses its
// stand-in, and is told why), then, if the workers alone are still beyond it, the largest workers; it returns how
// many workers it dropped. A tenant's oversized pods cost that tenant's workers, not the node's others.
func bound(workers map[string]Worker) (dropped int) {
	total := 0
	for _, wk := range workers {
		total += recordBytes(wk)
	}
	for total > MaxDesiredBytes {
		largest := ""
		for uid, wk := range workers {
			if wk.Manifest != "" && (largest == "" || len(wk.Manifest) > len(workers[largest].Manifest)) {
				largest = uid
			}
		}
		if largest == "" {
			break
		}
		wk := workers[largest]
		total -= recordBytes(wk)
		wk.Manifest, wk.ManifestRefused = "", fmt.Sprintf("the node's workers are beyond the agent's bound of %d bytes, and its pod is among the largest", MaxDesiredBytes)
		total += recordBytes(wk)
		workers[largest] = wk
	}
	for total > MaxDesiredBytes {
		largest := ""
		for uid, wk := range workers {
			if largest == "" || recordBytes(wk) > recordBytes(workers[largest]) {
				largest = uid
			}
		}
		total -= recordBytes(workers[largest])
		delete(workers, largest)
		dropped++
	}
	return dropped
}

// recordBytes is about what a worker takes in the saved file: its strings, and room for their keys.
func recordBytes(wk Worker) int {
	return 256 + len(wk.Namespace) + len(wk.Name) + len(wk.UID) + len(wk.Role) + len(wk.OfflinePolicy) + len(wk.RestartPolicy) +
		len(wk.WorkerName) + len(wk.Manifest) + len(wk.ManifestRefused) + len(wk.Dataset) + len(wk.DatasetIndex) + len(wk.DatasetFormat)
}

// Oversized is how many of the node's workers the agent cannot stand in for because of its bounds: those whose
// manifest it refused, and the worker pods it did not keep at all.
func (w *Watcher) Oversized() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.dropped
	for _, wk := range w.workers {
		if wk.ManifestRefused != "" {
			n++
		}
	}
	return n
}

// tellRefused logs each worker that has just lost its stand-in to the bounds.
func (w *Watcher) tellRefused(before map[string]Worker) {
	for _, wk := range w.Workers() {
		if wk.ManifestRefused != "" && before[wk.UID].ManifestRefused == "" {
			w.log.Error(nil, "a worker gets no stand-in: its pod is beyond the agent's bounds", "namespace", wk.Namespace,
				"pod", wk.Name, "reason", wk.ManifestRefused)
		}
	}
}
