package reportapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// DatasetInterval is how often Sedna's local controller counts a Dataset's samples; the agent does the same.
const DatasetInterval = 60 * time.Second

// maxIndexBytes bounds what the agent reads of one index file: an index lists sample paths, a few MiB.
const maxIndexBytes = 1 << 30

// errTooLarge is an index file past maxIndexBytes: not counted.
var errTooLarge = errors.New("index file over 1 GiB")

// DatasetCounter counts the samples of the Datasets the node's trainers read, as Sedna's local controller does
// (the lines of a txt index; of a csv one, the lines but its header), and publishes a count when it changed
// [P-DS-1].
type DatasetCounter struct {
	Cluster, Node string
	Sink          Sink
	// Workers lists the node's workers; a trainer's Dataset marks say which index file to count.
	Workers func() []desired.Worker
	// BirthSeq is the current birth's sequence; Counter numbers the counts across agent restarts (the journal).
	BirthSeq func() uint64
	Counter  interface {
		NextCounter(name string) (uint64, error)
	}
	// HostRoot is where the node's root is mounted in the agent's container ("": the agent sees the node's
	// paths as they are), as Sedna's LC's volume mount prefix.
	HostRoot string
	Log      logr.Logger

	sent map[string]int64 // namespace/name -> the count last published; touched by one goroutine only
}

// Run counts at once and then every interval, until ctx ends.
func (c *DatasetCounter) Run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		c.CountOnce()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// CountOnce counts every trainer's Dataset once and publishes the counts that changed; a file that cannot be
// read is logged and tried again next time.
func (c *DatasetCounter) CountOnce() {
	if c.sent == nil {
		c.sent = map[string]int64{}
	}
	done := map[string]bool{}
	for _, w := range c.Workers() {
		key := w.Namespace + "/" + w.Dataset
		if w.Dataset == "" || w.DatasetIndex == "" || done[key] {
			continue
		}
		done[key] = true
		n, err := CountSamples(filepath.Join(c.HostRoot, filepath.Clean("/"+w.DatasetIndex)), w.DatasetFormat)
		if err != nil {
			c.Log.V(2).Info("counting a dataset's samples", "dataset", key, "error", err.Error())
			continue
		}
		if last, had := c.sent[key]; had && last == n {
			continue
		}
		if err := c.publish(w.Namespace, w.Dataset, n); err != nil {
			c.Log.Error(err, "journaling a dataset count", "dataset", key)
			continue
		}
		c.sent[key] = n
	}
	for key := range c.sent { // a Dataset no trainer reads any more is counted afresh if one comes back
		if !done[key] {
			delete(c.sent, key)
		}
	}
}

func (c *DatasetCounter) publish(namespace, name string, n int64) error {
	seq, err := c.Counter.NextCounter("dataset")
	if err != nil {
		return err
	}
	payload, err := proto.Marshal(&lifelinev1.DatasetSamples{Namespace: namespace, Dataset: name, NumberOfSamples: n,
		Seq: seq, BirthSeq: c.BirthSeq(), CountedUnixNano: time.Now().UnixNano()})
	if err != nil {
		return err
	}
	topic := lifelinev1.NodeTopic(c.Cluster, c.Node, lifelinev1.KindDataset).String()
	return c.Sink.Enqueue(journal.Entry{Topic: topic, Payload: payload, QoS: 1})
}

// CountSamples counts the samples an index file lists as Sedna's local controller does: every line of a txt
// file, every line but the first (the header) of a csv file; other formats are not counted.
func CountSamples(path, format string) (int64, error) {
	if format != "txt" && format != "csv" {
		return 0, fmt.Errorf("format %q: only txt and csv indexes are counted", format)
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("opening the index: %w", err)
	}
	defer f.Close()
	r := bufio.NewReader(io.LimitReader(f, maxIndexBytes+1))
	var lines, read int64
	last := byte('\n')
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		read += int64(n)
		for _, b := range buf[:n] {
			if b == '\n' {
				lines++
			}
		}
		if n > 0 {
			last = buf[n-1]
		}
		if read > maxIndexBytes {
			return 0, errTooLarge
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("reading the index: %w", err)
		}
	}
	if last != '\n' {
		lines++ // a last line without its newline
	}
	if format == "csv" {
		if lines == 0 {
			return 0, fmt.Errorf("csv index %s is empty: no header", path)
		}
		lines--
	}
	return lines, nil
}
