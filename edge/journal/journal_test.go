package journal

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

func topics(es []Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Topic)
	}
	return out
}

func TestJournalKeepsOrderLatestStateAndBound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j, err := Open(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	put := func(topic, key string) uint64 {
		seq, err := j.Put(Entry{Topic: topic, Key: key, QoS: 1})
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	put("state-a-1", "a")
	put("report-1", "")
	put("state-b-1", "b")
	put("state-a-2", "a") // replaces state-a-1
	put("report-2", "")
	put("report-3", "")
	put("report-4", "") // the log holds 3: report-1 is dropped
	pending, err := j.Pending()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"state-b-1", "state-a-2", "report-2", "report-3", "report-4"}
	if fmt.Sprint(topics(pending)) != fmt.Sprint(want) {
		t.Fatalf("pending %v, want %v", topics(pending), want)
	}
	if j.Dropped() != 1 {
		t.Errorf("dropped %d, want 1", j.Dropped())
	}
	if err := j.Ack(pending[0].Seq); err != nil {
		t.Fatal(err)
	}
	if err := j.Ack(pending[2].Seq); err != nil {
		t.Fatal(err)
	}
	// Reopened, as after an agent restart: what was not acknowledged is still there, in order, and the counters
	// continue.
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	j, err = Open(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	pending, _ = j.Pending()
	want = []string{"state-a-2", "report-3", "report-4"}
	if fmt.Sprint(topics(pending)) != fmt.Sprint(want) {
		t.Fatalf("after reopen pending %v, want %v", topics(pending), want)
	}
	if seq := put("report-5", ""); seq != 8 {
		t.Errorf("sequence after reopen = %d, want 8", seq)
	}
	if j.Dropped() != 1 {
		t.Errorf("dropped after reopen %d, want 1", j.Dropped())
	}
}

func TestAckOfASupersededStateKeepsTheNewer(t *testing.T) {
	j, err := Open(filepath.Join(t.TempDir(), "j.db"), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	first, _ := j.Put(Entry{Topic: "s1", Key: "w"})
	if _, err := j.Put(Entry{Topic: "s2", Key: "w"}); err != nil {
		t.Fatal(err)
	}
	// The broker acknowledges the first state after the second replaced it.
	if err := j.Ack(first); err != nil {
		t.Fatal(err)
	}
	pending, _ := j.Pending()
	if fmt.Sprint(topics(pending)) != "[s2]" {
		t.Errorf("pending %v, want the newer state", topics(pending))
	}
}

func TestClaimedCommandsSurviveReopeningAndExpire(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j, err := Open(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	claim := func(id string, until, at time.Time) bool {
		t.Helper()
		ok, err := j.ClaimCommand(id, until, at)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !claim("a", now.Add(time.Minute), now) {
		t.Fatal("first claim of a refused")
	}
	if claim("a", now.Add(time.Minute), now) {
		t.Fatal("a claimed twice")
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if j, err = Open(path, 3); err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if claim("a", now.Add(time.Minute), now.Add(time.Second)) {
		t.Fatal("a claimed again after reopening the journal")
	}
	// Claiming another id after a's expiry forgets a.
	if !claim("b", now.Add(3*time.Minute), now.Add(2*time.Minute)) {
		t.Fatal("claim of b refused")
	}
	if !claim("a", now.Add(4*time.Minute), now.Add(2*time.Minute)) {
		t.Fatal("a was not forgotten after its expiry")
	}
	// An id is forgotten at its expiry even when no other id is claimed in between.
	if !claim("b", now.Add(5*time.Minute), now.Add(3*time.Minute+time.Second)) {
		t.Fatal("b claimed again after its expiry was refused")
	}
}

// A full disk (here: the file may not grow past 1 MiB) fails a Put and rolls its transaction back. Nothing of
// the failed write may stay in the log's counters: once space is back, reports and results are journaled again
// and the log's bound counts only what is in the file.
func TestFailedWriteOnAFullDiskLeavesTheLogUsable(t *testing.T) {
	j, err := open(filepath.Join(t.TempDir(), "journal.db"), Limits{Entries: 3}, &bolt.Options{Timeout: time.Second, MaxSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	first, err := j.Put(Entry{Topic: "report-1"})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := j.Put(Entry{Topic: "too-big", Payload: make([]byte, 2<<20)}); !errors.Is(err, berrors.ErrMaxSizeReached) {
			t.Fatalf("a write past the file's limit: %v, want %v", err, berrors.ErrMaxSizeReached)
		}
	}
	if err := j.Ack(first); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"report-2", "report-3", "report-4"} {
		if _, err := j.Put(Entry{Topic: topic}); err != nil {
			t.Fatalf("after the disk had room again: %v", err)
		}
	}
	pending, err := j.Pending()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(topics(pending)); got != "[report-2 report-3 report-4]" || j.Dropped() != 0 {
		t.Errorf("pending %s with %d dropped, want [report-2 report-3 report-4] and none dropped", got, j.Dropped())
	}
}

// Values survive reopening the journal (an agent restart), and a nil value removes its key.
func TestValuesSurviveReopening(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j, err := Open(path, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.SetValue("episode/default/w", []byte(`{"seq":7}`)); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if j, err = Open(path, 3); err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if v, err := j.Value("episode/default/w"); err != nil || string(v) != `{"seq":7}` {
		t.Fatalf("value after reopening %q (%v)", v, err)
	}
	if err := j.SetValue("episode/default/w", nil); err != nil {
		t.Fatal(err)
	}
	if v, err := j.Value("episode/default/w"); err != nil || v != nil {
		t.Errorf("value after removal %q (%v), want none", v, err)
	}
}

// A counter advanced to a seq handed out from memory goes on from there, across a reopen; advancing it to less
// changes nothing.
func TestAdvanceCounter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	j, err := Open(path, 10)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		advance, want uint64
	}{{0, 1}, {10, 11}, {5, 12}, {12, 13}}
	for _, s := range steps {
		if err := j.AdvanceCounter("worker-state", s.advance); err != nil {
			t.Fatal(err)
		}
		if got, err := j.NextCounter("worker-state"); err != nil || got != s.want {
			t.Errorf("advanced to %d: next %d (%v), want %d", s.advance, got, err, s.want)
		}
	}
	_ = j.AdvanceCounter("worker-state", 40)
	j.Close()
	if j, err = Open(path, 10); err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if got, _ := j.NextCounter("worker-state"); got != 41 {
		t.Errorf("after a reopen: next %d, want 41", got)
	}
}

// A local process posting the largest reports as fast as it can fills the log by bytes long before its count:
// the oldest go, counted, the log stays within its bytes across a restart, and one entry larger than the whole
// bound is refused rather than emptying the log.
func TestReportFloodIsBoundedInBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.db")
	limits := Limits{Entries: 10000, Bytes: 1 << 20}
	j, err := OpenLimited(path, limits)
	if err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 64<<10)
	for i := range 100 {
		if _, err := j.Put(Entry{Topic: fmt.Sprint("r", i), Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := j.Put(Entry{Topic: "state", Key: "default/w", Payload: payload}); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Put(Entry{Topic: "huge", Payload: make([]byte, 2<<20)}); err == nil {
		t.Error("an entry over the whole bound was journaled")
	}
	logBytes, dropped := j.LogBytes(), j.Dropped()
	log, err := j.PendingLog(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if logBytes > limits.Bytes || dropped == 0 || len(log) == 0 || log[len(log)-1].Topic != "r99" || int(dropped)+len(log) != 100 {
		t.Fatalf("log of %d bytes, %d entries ending %q, %d dropped: want at most %d bytes, the newest kept, the rest counted",
			logBytes, len(log), log[len(log)-1].Topic, dropped, limits.Bytes)
	}
	if states, err := j.PendingKeyed(); err != nil || len(states) != 1 {
		t.Errorf("states %v (%v): the worker's state must not make room for reports, nor be dropped", states, err)
	}
	j.Close()
	j, err = OpenLimited(path, limits)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if j.LogBytes() != logBytes || j.Dropped() != dropped {
		t.Errorf("reopened: %d bytes, %d dropped; want %d and %d", j.LogBytes(), j.Dropped(), logBytes, dropped)
	}
}

// The log is read a page at a time from where the last page ended, without the keyed entries between.
func TestPendingLogPagesSkipStates(t *testing.T) {
	j, err := Open(filepath.Join(t.TempDir(), "journal.db"), 100)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for i := range 10 {
		e := Entry{Topic: fmt.Sprint("r", i)}
		if i%3 == 0 {
			e = Entry{Topic: fmt.Sprint("s", i), Key: fmt.Sprint("k", i)}
		}
		if _, err := j.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	var pages []string
	for after := uint64(0); ; {
		page, err := j.PendingLog(after, 2)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		var topics []string
		for _, e := range page {
			topics = append(topics, e.Topic)
		}
		pages = append(pages, fmt.Sprint(topics))
		after = page[len(page)-1].Seq
	}
	if got := fmt.Sprint(pages); got != "[[r1 r2] [r4 r5] [r7 r8]]" {
		t.Errorf("pages %s, want the six reports two at a time", got)
	}
}
