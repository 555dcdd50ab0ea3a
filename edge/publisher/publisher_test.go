package publisher

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

func report(i int) journal.Entry {
	return journal.Entry{Topic: lifelinev1.NodeTopic("c", "edge-1", lifelinev1.KindReport).String(), QoS: 1,
		Payload: []byte(strconv.Itoa(i))}
}

// collect reads messages until it has the reports up to last (in the order first seen) or the timeout passes,
// and returns the reports, births and deaths seen.
func collect(t *testing.T, ch <-chan testkit.Message, last int, timeout time.Duration) (reports []int, births, deaths []uint64) {
	t.Helper()
	seen := map[int]bool{}
	deadline := time.After(timeout)
	for {
		select {
		case m := <-ch:
			switch m.Topic.Kind {
			case lifelinev1.KindReport:
				n, _ := strconv.Atoi(string(m.Payload))
				if !seen[n] { // QoS 1 may deliver twice
					seen[n] = true
					reports = append(reports, n)
				}
				if n == last {
					return
				}
			case lifelinev1.KindBirth:
				b := &lifelinev1.NodeBirth{}
				if err := proto.Unmarshal(m.Payload, b); err != nil {
					t.Fatal(err)
				}
				births = append(births, b.BirthSeq)
			case lifelinev1.KindDeath:
				d := &lifelinev1.NodeDeath{}
				if err := proto.Unmarshal(m.Payload, d); err != nil {
					t.Fatal(err)
				}
				deaths = append(deaths, d.BirthSeq)
			}
		case <-deadline:
			return
		}
	}
}

// openJournal opens a journal of 1,000 reports in a fresh state directory, closed when the test ends.
func openJournal(t *testing.T) (string, *journal.Journal) {
	t.Helper()
	dir := t.TempDir()
	j, err := journal.Open(filepath.Join(dir, "journal.db"), 1000)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return dir, j
}

// startPublisher runs a publisher of node edge-1 in cluster c, with cfg's broker, timings and log (none unless
// set) and a fresh journal and state directory, until the test ends.
func startPublisher(t *testing.T, cfg Config) (*Publisher, *journal.Journal) {
	t.Helper()
	dir, j := openJournal(t)
	cfg.Cluster, cfg.Node, cfg.StateDir = "c", "edge-1", dir
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	p := New(cfg, j)
	testkit.Background(t, context.Background(), p.Run)
	return p, j
}

// enqueueReports journals the reports numbered from to to.
func enqueueReports(t *testing.T, p *Publisher, from, to int) {
	t.Helper()
	for i := from; i <= to; i++ {
		if err := p.Enqueue(report(i)); err != nil {
			t.Fatal(err)
		}
	}
}

func seq(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// drained is a condition for testkit.UntilErr: the journal holds nothing left to send.
func drained(j *journal.Journal) func(context.Context) (bool, error) {
	return testkit.Why(func() (bool, string) {
		pending, err := j.Pending()
		return err == nil && len(pending) == 0, fmt.Sprintf("%d entries pending, %v", len(pending), err)
	})
}

// [P-JRN-1] [P-BIRTH-2] [P-DEATH-1] A cut link loses nothing: what was journaled meanwhile arrives in order
// after a new birth, and the broker publishes the old session's death.
func TestJournalIsReplayedInOrderAfterAnOutage_P_JRN_1(t *testing.T) {
	broker := testkit.StartBroker(t)
	link, err := testkit.Start(broker)
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	received := testkit.Subscribe(t, broker, "c", "controller")

	dir, j := openJournal(t)
	p := New(Config{Broker: "tcp://" + link.Addr(), Cluster: "c", Node: "edge-1", StateDir: dir, BootID: "boot-1",
		RetryInterval: 100 * time.Millisecond, AckTimeout: time.Second, Log: logr.Discard()}, j)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()

	enqueueReports(t, p, 1, 5)
	reports, births, _ := collect(t, received, 5, 10*time.Second)
	if fmt.Sprint(reports) != fmt.Sprint(seq(1, 5)) || fmt.Sprint(births) != "[1]" {
		t.Fatalf("before the outage: reports %v births %v", reports, births)
	}
	// Delivered is not yet acknowledged: a report whose PUBACK the cut would lose is sent again, as QoS 1 allows
	// (the controller drops it by its seq). Cut once the journal holds nothing, so every report after the cut was
	// journaled while the link was down.
	testkit.UntilErr(t, 5*time.Second, "the journal drained before the outage", drained(j))

	tried := p.Attempts()
	link.Cut()
	enqueueReports(t, p, 6, 50)
	// The publisher saw the session lost, and an attempt to open another failed through the cut link.
	testkit.Until(t, 5*time.Second, "a failed attempt through the cut link", func() bool { return p.Attempts() >= tried+2 })
	link.Restore()
	reports, births, deaths := collect(t, received, 50, 15*time.Second)
	if fmt.Sprint(reports) != fmt.Sprint(seq(6, 50)) {
		t.Errorf("after the outage: reports %v, want 6..50 in order", reports)
	}
	if len(births) == 0 || births[len(births)-1] < 2 {
		t.Errorf("no new birth after reconnecting: %v", births)
	}
	if fmt.Sprint(deaths) != "[1]" {
		t.Errorf("deaths %v, want the first session's will", deaths)
	}
	// The subscriber may see the last report before the publisher has processed the broker's acknowledgement.
	testkit.UntilErr(t, 5*time.Second, "the journal emptied once the broker acknowledged its entries", drained(j))

	// A subscriber arriving later sees the retained birth and death, which it orders by birth sequence.
	_, births, deaths = collect(t, testkit.Subscribe(t, broker, "c", "late"), -1, time.Second)
	if len(births) != 1 || len(deaths) != 1 || births[0] <= deaths[0] {
		t.Errorf("retained birth %v and death %v: the birth must be newer", births, deaths)
	}

	cancel()
	<-done
	_, _, deaths = collect(t, received, -1, time.Second)
	if len(deaths) == 0 || deaths[len(deaths)-1] != p.BirthSeq() {
		t.Errorf("a clean stop published deaths %v, want one for birth %d", deaths, p.BirthSeq())
	}
}

// slowAcks holds back the broker's acknowledgement of the first report until release: mochi acknowledges a QoS 1
// publish only once its hooks have run.
type slowAcks struct {
	mochi.HookBase
	release <-chan struct{}
	once    sync.Once
}

func (h *slowAcks) ID() string           { return "slow-acks" }
func (h *slowAcks) Provides(b byte) bool { return b == mochi.OnPublish }

func (h *slowAcks) OnPublish(_ *mochi.Client, pk packets.Packet) (packets.Packet, error) {
	if topic, err := lifelinev1.ParseTopic(pk.TopicName); err == nil && topic.Kind == lifelinev1.KindReport {
		h.once.Do(func() { <-h.release })
	}
	return pk, nil
}

// [P-JRN-1] A broker slower to acknowledge than AckTimeout keeps its session: the agent waits, and sends on in
// the same session, rather than adding a new birth and a replay to a broker that is behind.
func TestASlowAcknowledgementKeepsTheSession_P_JRN_1(t *testing.T) {
	release := make(chan struct{})
	var released sync.Once
	acknowledge := func() { released.Do(func() { close(release) }) }
	broker := testkit.StartBroker(t, &slowAcks{release: release})
	t.Cleanup(acknowledge) // before the broker stops: its hook must not hold it
	received := testkit.Subscribe(t, broker, "c", "controller")
	// The publisher logs once it has waited AckTimeout for an acknowledgement: the broker is slower than that.
	waited := make(chan struct{}, 1)
	log := funcr.New(func(_, args string) {
		if strings.Contains(args, "broker slow to acknowledge") {
			select {
			case waited <- struct{}{}:
			default:
			}
		}
	}, funcr.Options{Verbosity: 2})
	p, _ := startPublisher(t, Config{Broker: "tcp://" + broker, BootID: "boot-1", RetryInterval: 100 * time.Millisecond,
		AckTimeout: 300 * time.Millisecond, Log: log})

	enqueueReports(t, p, 1, 5)
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("the publisher never waited its AckTimeout for the held acknowledgement")
	}
	acknowledge()
	reports, births, deaths := collect(t, received, 5, 10*time.Second)
	if fmt.Sprint(reports) != fmt.Sprint(seq(1, 5)) {
		t.Errorf("reports %v, want 1..5 in order", reports)
	}
	// A birth is sent at QoS 1, so it may arrive twice; a second session would be born with seq 2.
	if fmt.Sprint(slices.Compact(births)) != "[1]" || len(deaths) != 0 {
		t.Errorf("births %v, deaths %v: want the one session [1], never ended", births, deaths)
	}
}

// After a controller restart every agent of the fleet fails to connect at once: the waits grow to the cap
// instead of a thousand TLS handshakes a second, and a session that came up starts them again from the base.
func TestReconnectWaitsDoubleToTheCapAndResetAfterASession(t *testing.T) {
	b := backoff{base: time.Second, max: 15 * time.Second}
	var got []time.Duration
	for range 6 {
		got = append(got, b.next())
	}
	b.reset()
	got = append(got, b.next())
	if want := "[1s 2s 4s 8s 15s 15s 1s]"; fmt.Sprint(got) != want {
		t.Errorf("waits %v, want %s", got, want)
	}
}

func TestJitteredRetryStaysWithinHalfAndOneAndAHalf(t *testing.T) {
	seen := map[bool]bool{}
	for range 1000 {
		d := jittered(time.Second)
		if d < 500*time.Millisecond || d >= 1500*time.Millisecond {
			t.Fatalf("jittered(1s) = %v, want in [0.5s, 1.5s)", d)
		}
		seen[d < time.Second] = true
	}
	if len(seen) != 2 {
		t.Errorf("1,000 draws all on one side of the interval: %v", seen)
	}
}

// pageCountingJournal records the most entries and bytes the publisher held from one read of the journal.
type pageCountingJournal struct {
	*journal.Journal
	mu                  sync.Mutex
	mostEntries, mostKB int
}

func (j *pageCountingJournal) PendingLog(after uint64, limit int) ([]journal.Entry, error) {
	out, err := j.Journal.PendingLog(after, limit)
	size := 0
	for _, e := range out {
		size += len(e.Payload)
	}
	j.mu.Lock()
	j.mostEntries, j.mostKB = max(j.mostEntries, len(out)), max(j.mostKB, size>>10)
	j.mu.Unlock()
	return out, err
}

// A worker floods the agent with the largest reports while the broker is away. On reconnection the workers'
// states go out first, ahead of the whole replay, and the replay reads the journal a page at a time: the agent
// never holds more than a page of reports, however full the journal.
func TestStatesGoFirstAndReportsReplayAPageAtATimeAfterAFlood(t *testing.T) {
	broker := testkit.StartBroker(t)
	received := testkit.Subscribe(t, broker, "c", "controller")
	dir := t.TempDir()
	j, err := journal.OpenLimited(filepath.Join(dir, "journal.db"), journal.Limits{Entries: 10000, Bytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	big := make([]byte, lifelinev1.MaxReportBodyBytes)
	const flood = 200 // 12.5 MiB of reports, three times the journal's bound
	for i := 1; i <= flood; i++ {
		e := report(i)
		e.Payload = append([]byte(strconv.Itoa(i)+" "), big[:len(big)-8]...)
		if _, err := j.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	state := journal.Entry{Topic: lifelinev1.WorkerTopic("c", "edge-1", "default", "w").String(), QoS: 1,
		Retained: true, Key: "default/w", Payload: []byte("dead")}
	if _, err := j.Put(state); err != nil {
		t.Fatal(err)
	}
	if j.LogBytes() > 4<<20 || j.Dropped() == 0 {
		t.Fatalf("log of %d bytes with %d dropped, want at most 4 MiB and the oldest dropped", j.LogBytes(), j.Dropped())
	}

	counting := &pageCountingJournal{Journal: j}
	p := New(Config{Broker: "tcp://" + broker, Cluster: "c", Node: "edge-1", StateDir: dir, BootID: "boot-1",
		RetryInterval: 100 * time.Millisecond, Log: logr.Discard()}, counting)
	testkit.Background(t, context.Background(), p.Run)

	var order []string
	for deadline := time.After(20 * time.Second); len(order) == 0 || order[len(order)-1] != strconv.Itoa(flood); {
		select {
		case m := <-received:
			switch m.Topic.Kind {
			case lifelinev1.KindWorkerState:
				order = append(order, "state")
			case lifelinev1.KindReport:
				n, _, _ := strings.Cut(string(m.Payload), " ")
				order = append(order, n)
			}
		case <-deadline:
			t.Fatalf("replay incomplete after 20 s: %d messages", len(order))
		}
	}
	if order[0] != "state" {
		t.Errorf("first message after the birth: report %s, want the worker's state", order[0])
	}
	counting.mu.Lock()
	defer counting.mu.Unlock()
	t.Logf("%d messages after the birth, %d reports dropped; the most read at once: %d reports, %d KiB", len(order), j.Dropped(),
		counting.mostEntries, counting.mostKB)
	if counting.mostEntries > replayPage || counting.mostKB > replayPage*lifelinev1.MaxReportBodyBytes>>10 {
		t.Errorf("one read of the journal held %d reports (%d KiB), want at most a page of %d", counting.mostEntries, counting.mostKB, replayPage)
	}
}
