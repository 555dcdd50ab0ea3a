package publisher

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/lifeline-edge/lifeline/edge/journal"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// [P-BIRTH-2] A birth-seq file that does not parse (torn, zeroed by a crash) no longer becomes 0 silently,
// which would send births the controller takes as replays: it is moved aside, and the sequence continues from
// the wall clock in milliseconds, above any count of earlier connections.
func TestUnparsableBirthSeqIsMovedAsideAndSeededFromTheClock_P_BIRTH_2(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "birth-seq")
	if err := os.WriteFile(path, []byte("\x00\x00\x00"), 0o600); err != nil {
		t.Fatal(err)
	}
	clock := time.UnixMilli(1_796_000_000_000)
	p := New(Config{StateDir: dir, Log: logr.Discard(), Now: func() time.Time { return clock }}, nil)
	first, err := p.nextBirthSeq()
	if err != nil {
		t.Fatal(err)
	}
	if first != uint64(clock.UnixMilli())+1 {
		t.Errorf("birth seq %d after an unparsable file, want %d (the clock in ms, plus one)", first, clock.UnixMilli()+1)
	}
	if next, err := p.nextBirthSeq(); err != nil || next != first+1 {
		t.Errorf("next birth seq %d (%v), want %d", next, err, first+1)
	}
	aside, _ := filepath.Glob(path + ".corrupt-*")
	if len(aside) != 1 {
		t.Fatalf("moved aside: %v, want the unparsable file kept", aside)
	}
	if data, _ := os.ReadFile(aside[0]); string(data) != "\x00\x00\x00" {
		t.Errorf("the moved-aside file holds %q", data)
	}
}

// [P-BIRTH-3] Every birth names the state directory by a random id created with it: the same across restarts
// of the agent on that directory, another for a new (wiped) directory, so the controller can tell a new state
// epoch from a replay.
func TestBirthNamesTheStateDirectory_P_BIRTH_3(t *testing.T) {
	broker := testkit.StartBroker(t)
	received := testkit.Subscribe(t, broker, "c", "controller")
	var lastSeen *lifelinev1.NodeBirth
	birthFrom := func(dir string) *lifelinev1.NodeBirth {
		t.Helper()
		j, err := journal.Open(filepath.Join(dir, "journal.db"), 10)
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		p := New(Config{Broker: "tcp://" + broker, Cluster: "c", Node: "edge-1", StateDir: dir, BootID: "boot-1",
			RetryInterval: 50 * time.Millisecond, HeartbeatInterval: 10 * time.Second,
			APIReachable: func() (bool, bool) { return false, true }, Log: logr.Discard()}, j)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { p.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case m := <-received:
				b := &lifelinev1.NodeBirth{}
				if m.Topic.Kind != lifelinev1.KindBirth || proto.Unmarshal(m.Payload, b) != nil || proto.Equal(b, lastSeen) {
					continue // another message, or the retained birth of the previous run
				}
				lastSeen = b
				return b
			case <-deadline:
				t.Fatal("no birth within 10s")
			}
		}
	}
	dir := t.TempDir()
	first := birthFrom(dir)
	again := birthFrom(dir)
	fresh := birthFrom(t.TempDir())
	if !validStateID(first.StateId) || again.StateId != first.StateId || again.BirthSeq <= first.BirthSeq {
		t.Errorf("births %v then %v on one state directory, want one valid state id and a growing sequence", first, again)
	}
	if first.ApiReachable == nil || *first.ApiReachable {
		t.Errorf("birth says api_reachable %v, want the agent's false [P-HB-1]", first.ApiReachable)
	}
	if first.HeartbeatIntervalMillis != 10000 {
		t.Errorf("birth says a heartbeat every %d ms, want the agent's 10000 [P-HB-3]", first.HeartbeatIntervalMillis)
	}
	if fresh.StateId == first.StateId || !validStateID(fresh.StateId) {
		t.Errorf("a new state directory's birth %v shares the state id of %v", fresh, first)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "state-id")); err != nil || string(data) != first.StateId {
		t.Errorf("state-id file %q (%v), want %q", data, err, first.StateId)
	}
}

// [P-HB-1] An agent that has not yet heard from its watch or its probe (just started) says nothing of its reach
// in the birth, rather than a false "cut off" the controller would act on until the first heartbeat.
func TestBirthSaysNothingOfAReachNotYetKnown_P_HB_1(t *testing.T) {
	p := New(Config{APIReachable: func() (bool, bool) { return false, false }}, nil)
	if got := p.apiReachable(); got != nil {
		t.Errorf("birth's api_reachable %v before the agent knows, want unset", *got)
	}
}
