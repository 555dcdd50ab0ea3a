package reportapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// DatasetInterval is how often Sedna's local controller counts a Dataset's samples; the agent does the same.
const DatasetInterval = 60 * time.Second

// DefaultMaxIndexBytes bounds what the agent reads of one index file: an index lists sample paths, and 64 MiB of
// them is about a million samples, while reading more, once a minute, would cost the node's CPU for nothing.
const DefaultMaxIndexBytes = 64 << 20

// DefaultCountTimeout bounds the reading of one index file, so that a file on a stalled mount delays the other
// Datasets' counts by at most this much, once.
const DefaultCountTimeout = 5 * time.Second

// neverCounted are the node directories the agent never reads an index in, whatever a pod names and mounts:
// pseudo-files that block or never end (/proc, /sys, /dev), the node's and its agents' secrets (/etc, /run,
// edgecore's and kubelet's state). The agent's own state directory is refused as well (DatasetCounter.StateDir).
var neverCounted = []string{"/proc", "/sys", "/dev", "/run", "/var/run", "/etc", "/boot", "/var/lib/kubeedge", "/var/lib/kubelet"}

// DatasetCounter counts the samples of the Datasets the node's trainers read, as Sedna's local controller does
// (the lines of a txt index; of a csv one, the lines but its header), and publishes a count when it changed
// [P-DS-1].
//
// The agent runs as root and the index path comes from a pod's annotation, which whoever may create pods can
// write, so the agent reads an index only where the pod could read it itself: the trainer's own pod must mount,
// from the node, the index's directory or one above it, as the controller renders a trainer (it mounts the
// Dataset's directory). Even then the agent never reads under /proc, /sys, /dev, /run, /etc, /boot, edgecore's
// and kubelet's state or its own StateDir, follows no symlink (which could lead out of the mounted directory, or
// out of HostRoot: a node whose Dataset paths go through symlinks must name the paths they lead to), and counts
// regular files only, of at most MaxIndexBytes, each within CountTimeout, so that one Dataset's bad file never
// stops the counting of the others.
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
	// paths as they are), as Sedna's LC's volume mount prefix. No index is read outside it.
	HostRoot string
	// StateDir is the agent's own state directory, as a node path: never counted.
	StateDir string
	// MaxIndexBytes bounds the bytes read of one index (0: DefaultMaxIndexBytes); a larger file is not counted.
	MaxIndexBytes int64
	// CountTimeout bounds the reading of one index (0: DefaultCountTimeout); a file not read by then is not
	// counted, nor read again until that read has ended.
	CountTimeout time.Duration
	Log          logr.Logger

	sent    map[string]int64         // namespace/name -> the count last published; touched by one goroutine only
	noted   map[string]string        // namespace/name -> why it was last not counted, logged once
	reading map[string]chan struct{} // index path -> closed when a read past its bound has ended
	// countFile counts one index (nil: countIndex); tests stand in for a file system that stalls.
	countFile func(ctx context.Context, hostRoot, index, format string, maxBytes int64) (int64, error)
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

// CountOnce counts every trainer's Dataset once and publishes the counts that changed; a file that cannot or may
// not be read is logged once (at V(2)), not counted, and tried again next time.
func (c *DatasetCounter) CountOnce() {
	if c.sent == nil {
		c.sent, c.noted, c.reading = map[string]int64{}, map[string]string{}, map[string]chan struct{}{}
	}
	done, seen := map[string]bool{}, map[string]bool{}
	for _, w := range c.Workers() {
		key := w.Namespace + "/" + w.Dataset
		if w.Dataset == "" || w.DatasetIndex == "" || done[key] {
			continue
		}
		seen[key] = true
		index := path.Clean("/" + w.DatasetIndex)
		if err := c.mayRead(w, index); err != nil {
			c.note(key, err) // another trainer of the Dataset may name an index its pod mounts
			continue
		}
		done[key] = true
		n, err := c.count(index, w.DatasetFormat)
		if err != nil {
			c.note(key, err)
			continue
		}
		delete(c.noted, key)
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
	for key := range c.noted {
		if !seen[key] {
			delete(c.noted, key)
		}
	}
}

// note logs why a Dataset was not counted, once until the reason changes: the agent counts every minute.
func (c *DatasetCounter) note(key string, err error) {
	if c.noted[key] == err.Error() {
		return
	}
	c.noted[key] = err.Error()
	c.Log.V(2).Info("not counting a dataset's samples", "dataset", key, "error", err.Error())
}

// mayRead says whether the agent may read index (a clean node path) for w: see DatasetCounter.
func (c *DatasetCounter) mayRead(w desired.Worker, index string) error {
	denied := neverCounted
	if c.StateDir != "" {
		denied = append(denied[:len(denied):len(denied)], path.Clean("/"+c.StateDir))
	}
	for _, dir := range denied {
		if within(index, dir) {
			return fmt.Errorf("index %s is under %s, which the agent never reads", index, dir)
		}
	}
	var pod struct {
		Spec struct {
			Volumes []struct {
				HostPath *struct {
					Path string `json:"path"`
				} `json:"hostPath"`
			} `json:"volumes"`
		} `json:"spec"`
	}
	if w.Manifest != "" {
		if err := json.Unmarshal([]byte(w.Manifest), &pod); err != nil {
			return fmt.Errorf("reading the volumes of pod %s/%s: %w", w.Namespace, w.Name, err)
		}
	}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil && v.HostPath.Path != "" && within(index, path.Clean("/"+v.HostPath.Path)) {
			return nil
		}
	}
	return fmt.Errorf("index %s: pod %s/%s mounts no node directory holding it", index, w.Namespace, w.Name)
}

// within says whether the clean path p is dir or lies under it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// count counts index within CountTimeout. A read past it is left to end on its own (a read of a stalled mount
// cannot be interrupted), and the file is not read again until it has, so a stalled file holds one goroutine,
// not one a minute.
func (c *DatasetCounter) count(index, format string) (int64, error) {
	timeout, maxBytes, countFile := c.CountTimeout, c.MaxIndexBytes, c.countFile
	if timeout <= 0 {
		timeout = DefaultCountTimeout
	}
	if maxBytes <= 0 {
		maxBytes = DefaultMaxIndexBytes
	}
	if countFile == nil {
		countFile = countIndex
	}
	if ended, stalled := c.reading[index]; stalled {
		select {
		case <-ended:
			delete(c.reading, index)
		default:
			return 0, fmt.Errorf("index %s: still reading it since a read went past %v", index, timeout)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	type counted struct {
		n   int64
		err error
	}
	result, ended := make(chan counted, 1), make(chan struct{})
	go func() {
		defer close(ended)
		n, err := countFile(ctx, c.HostRoot, index, format, maxBytes)
		result <- counted{n, err}
	}()
	select {
	case r := <-result:
		return r.n, r.err
	case <-ctx.Done():
		c.reading[index] = ended
		return 0, fmt.Errorf("index %s: not read within %v", index, timeout)
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

// countIndex counts the samples of index (a clean node path) under hostRoot ("": "/").
func countIndex(ctx context.Context, hostRoot, index, format string, maxBytes int64) (int64, error) {
	if err := checkFormat(format); err != nil {
		return 0, err
	}
	f, err := openIndex(hostRoot, index)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if info, err := f.Stat(); err != nil {
		return 0, fmt.Errorf("index %s: %w", index, err)
	} else if info.Size() > maxBytes {
		return 0, fmt.Errorf("index %s: %w of %d bytes", index, errTooLarge, maxBytes)
	}
	return countSamples(ctx, f, format, maxBytes)
}

// checkFormat refuses the formats Sedna's local controller does not count either.
func checkFormat(format string) error {
	if format != "txt" && format != "csv" {
		return fmt.Errorf("format %q: only txt and csv indexes are counted", format)
	}
	return nil
}

// errSymlink is a symlink on an index's path: it could lead anywhere on the node, or out of the host root.
var errSymlink = errors.New("is a symlink, which the agent does not follow")

// openIndex opens index (a clean node path) under hostRoot for reading, without following any symlink, without
// leaving hostRoot, and only if it is a regular file: a FIFO's or a device's open could block for ever or act
// (/dev/ptmx), so those are never opened, and the open does not block should one be put in place in between.
func openIndex(hostRoot, index string) (*os.File, error) {
	if hostRoot == "" {
		hostRoot = "/"
	}
	if index == "/" {
		return nil, errors.New("index / is no file")
	}
	names := strings.Split(strings.TrimPrefix(index, "/"), "/")
	root, err := os.OpenRoot(hostRoot)
	if err != nil {
		return nil, fmt.Errorf("opening the host root %s: %w", hostRoot, err)
	}
	defer func() { root.Close() }()
	at := ""
	for _, dir := range names[:len(names)-1] {
		at += "/" + dir
		info, err := root.Lstat(dir)
		if err != nil {
			return nil, fmt.Errorf("index %s: %w", index, err)
		}
		if info.Mode()&os.ModeSymlink != 0 {
			return nil, fmt.Errorf("index %s: %s %w", index, at, errSymlink)
		}
		sub, err := root.OpenRoot(dir)
		if err != nil {
			return nil, fmt.Errorf("index %s: opening %s: %w", index, at, err)
		}
		root.Close()
		root = sub
	}
	name := names[len(names)-1]
	info, err := root.Lstat(name)
	if err != nil {
		return nil, fmt.Errorf("index %s: %w", index, err)
	}
	if info.Mode()&os.ModeSymlink != 0 {
		return nil, fmt.Errorf("index %s %w", index, errSymlink)
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("index %s is no regular file (%v)", index, info.Mode().Type())
	}
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the index: %w", err)
	}
	opened, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("index %s: %w", index, err)
	}
	if !opened.Mode().IsRegular() || !os.SameFile(info, opened) {
		f.Close()
		return nil, fmt.Errorf("index %s was replaced while it was opened", index)
	}
	return f, nil
}

// errTooLarge is an index file past the byte bound: not counted rather than counted in part.
var errTooLarge = errors.New("index file over the byte bound")

// countSamples counts the samples an index lists as Sedna's local controller does: every line of a txt file,
// every line but the first (the header) of a csv file; other formats are not counted. Past maxBytes, or once
// ctx ends, it counts nothing: a partial count would publish a wrong number.
func countSamples(ctx context.Context, r io.Reader, format string, maxBytes int64) (int64, error) {
	if err := checkFormat(format); err != nil {
		return 0, err
	}
	br := bufio.NewReader(io.LimitReader(r, maxBytes+1))
	var lines, read int64
	last := byte('\n')
	buf := make([]byte, 64<<10)
	for {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("reading the index: %w", err)
		}
		n, err := br.Read(buf)
		read += int64(n)
		for _, b := range buf[:n] {
			if b == '\n' {
				lines++
			}
		}
		if n > 0 {
			last = buf[n-1]
		}
		if read > maxBytes {
			return 0, fmt.Errorf("%w of %d bytes", errTooLarge, maxBytes)
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
			return 0, errors.New("csv index is empty: no header")
		}
		lines--
	}
	return lines, nil
}
