package scale

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on every Linux architecture Go runs on.
const clockTicks = 100

// procSample is a process's CPU time and memory at one moment.
type procSample struct {
	at       time.Time
	cpu      time.Duration // user + system
	rss, hwm int64         // resident set now and at its peak, bytes
}

// sampleProc reads /proc/<pid>/stat and /proc/<pid>/status.
func sampleProc(pid int) (procSample, error) {
	s := procSample{at: time.Now()}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("reading the CPU time of process %d: %w", pid, err)
	}
	if s.cpu, err = parseStatCPU(string(stat)); err != nil {
		return s, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("reading the memory of process %d: %w", pid, err)
	}
	s.rss, s.hwm = parseStatusKiB(string(status), "VmRSS:")*1024, parseStatusKiB(string(status), "VmHWM:")*1024
	return s, nil
}

// parseStatCPU is utime + stime of a /proc/<pid>/stat line. The command name (field 2) may hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("unparsable /proc stat %q", stat)
	}
	fields := strings.Fields(stat[end+1:])
	// fields[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(fields) < 13 {
		return 0, fmt.Errorf("short /proc stat %q", stat)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("unparsable CPU time %q in /proc stat: %w", f, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// parseStatusKiB is the value of a "<key> <n> kB" line of /proc/<pid>/status; 0 when absent.
func parseStatusKiB(status, key string) int64 {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			fields := strings.Fields(rest)
			if len(fields) > 0 {
				v, _ := strconv.ParseInt(fields[0], 10, 64)
				return v
			}
		}
	}
	return 0
}

// cores is the CPU a process used between two samples, in cores.
func cores(from, to procSample) float64 {
	wall := to.at.Sub(from.at)
	if wall <= 0 {
		return 0
	}
	return float64(to.cpu-from.cpu) / float64(wall)
}

// histogram is one Prometheus histogram: cumulative counts by upper bound, as /metrics exposes them.
type histogram map[float64]float64

// scrapeHistograms reads the buckets of the histogram metric name from a Prometheus text endpoint, one
// histogram per value of the label key (e.g. controller).
func scrapeHistograms(url, name, key string, where ...string) (map[string]histogram, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	return parseHistograms(resp.Body, name, key, where...)
}

// parseHistograms reads the histograms name from Prometheus text, one per value of the label key, of the series
// whose labels hold every where ("label=value").
func parseHistograms(r io.Reader, name, key string, where ...string) (map[string]histogram, error) {
	out := map[string]histogram{}
	err := eachSample(r, name+"_bucket", func(line, labels string, v float64) error {
		var group string
		le := math.NaN()
		matched := 0
		for _, l := range strings.Split(labels, ",") {
			k, val, _ := strings.Cut(l, "=")
			val = strings.Trim(val, `"`)
			if slices.Contains(where, k+"="+val) {
				matched++
			}
			switch k {
			case key:
				group = val
			case "le":
				var err error
				if le, err = strconv.ParseFloat(val, 64); err != nil {
					return fmt.Errorf("unparsable bucket %q: %w", line, err)
				}
			}
		}
		if math.IsNaN(le) || matched < len(where) {
			return nil
		}
		if out[group] == nil {
			out[group] = histogram{}
		}
		out[group][le] += v
		return nil
	})
	return out, err
}

// minus is what the histogram counted since before.
func (h histogram) minus(before histogram) histogram {
	d := histogram{}
	for le, n := range h {
		d[le] = n - before[le]
	}
	return d
}

// count is how many observations the histogram holds.
func (h histogram) count() float64 { return h[math.Inf(1)] }

// quantile estimates the q-quantile as Prometheus' histogram_quantile does: linear within the bucket that holds
// it. It is 0 for an empty histogram, and the highest finite bound when the quantile is in the +Inf bucket.
func (h histogram) quantile(q float64) float64 {
	bounds := make([]float64, 0, len(h))
	for le := range h {
		bounds = append(bounds, le)
	}
	sort.Float64s(bounds)
	total := h.count()
	if total <= 0 || len(bounds) == 0 {
		return 0
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, le := range bounds {
		n := h[le]
		if n >= rank {
			if math.IsInf(le, 1) {
				return lower
			}
			if n == below {
				return le
			}
			return lower + (le-lower)*(rank-below)/(n-below)
		}
		lower, below = le, n
	}
	return lower
}

// scrapeGauges reads the samples of name (a gauge or a counter) from a Prometheus text endpoint, summed by the
// value of the label key (e.g. a work queue's depth over its priorities).
func scrapeGauges(url, name, key string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	return parseGauges(resp.Body, name, key)
}

// parseGauges sums the samples of name by the values of the labels keys, joined by "/" in the keys' order (a
// label a sample lacks, or has empty, is left out: "POST/pods", "PATCH/pods/status").
func parseGauges(r io.Reader, name string, keys ...string) (map[string]float64, error) {
	out := map[string]float64{}
	err := eachSample(r, name, func(_, labels string, v float64) error {
		values := map[string]string{}
		for _, l := range strings.Split(labels, ",") {
			if k, val, ok := strings.Cut(l, "="); ok {
				values[k] = strings.Trim(val, `"`)
			}
		}
		var group []string
		found := false
		for _, k := range keys {
			val, ok := values[k]
			found = found || ok
			if val != "" {
				group = append(group, val)
			}
		}
		if found {
			out[strings.Join(group, "/")] += v
		}
		return nil
	})
	return out, err
}

// parseValues reads, in Prometheus text, the value of each unlabelled series of names that it holds.
func parseValues(r io.Reader, names ...string) (map[string]float64, error) {
	wanted := map[string]bool{}
	for _, n := range names {
		wanted[n] = true
	}
	out := map[string]float64{}
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for s.Scan() {
		name, value, ok := strings.Cut(s.Text(), " ")
		if !ok || !wanted[name] {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return nil, fmt.Errorf("unparsable sample %q: %w", s.Text(), err)
		}
		out[name] = v
	}
	return out, s.Err()
}

// eachSample calls fn with each labelled sample of the series name in Prometheus text: the line, its labels
// (between the braces) and its value.
func eachSample(r io.Reader, name string, fn func(line, labels string, v float64) error) error {
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for s.Scan() {
		line := s.Text()
		rest, ok := strings.CutPrefix(line, name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			return fmt.Errorf("unparsable sample %q: %w", line, err)
		}
		if err := fn(line, labels, v); err != nil {
			return err
		}
	}
	return s.Err()
}
