package liveness

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// stateStream is n worker-state messages of 100 nodes with 10 workers each, seqs increasing, as topic and
// payload pairs.
func stateStream(n int) (topics []string, payloads [][]byte) {
	for i := range n {
		node, worker := fmt.Sprintf("edge-%d", i%100), fmt.Sprintf("worker-%d", (i/100)%10)
		ws := &lifelinev1.WorkerState{Namespace: "default", Name: worker, Uid: node + worker, Seq: uint64(i + 1),
			Phase: lifelinev1.Phase_PHASE_RUNNING, ObservedUnixNano: time.Now().UnixNano(), BirthSeq: 1,
			Containers: []*lifelinev1.ContainerState{{Name: "main", Running: true, Restarts: 1}}}
		payload, _ := proto.Marshal(ws)
		topics = append(topics, lifelinev1.WorkerTopic("c", node, "default", worker).String())
		payloads = append(payloads, payload)
	}
	return topics, payloads
}

// BenchmarkIngestWorkerStates measures how many worker states one core of the controller takes into the
// liveness table, against the anchor of only decoding them (the least any receiver must do).
func BenchmarkIngestWorkerStates(b *testing.B) {
	const n = 200000
	topics, payloads := stateStream(n)
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	for range b.N {
		tr, err := NewTracker("c", prometheus.NewRegistry(), logr.Discard())
		if err != nil {
			b.Fatal(err)
		}
		tr.Subscribe() // a subscriber, as the two controllers are
		start := time.Now()
		for i := range n {
			tr.Ingest(topics[i], payloads[i], start)
		}
		ingest := time.Since(start)

		start = time.Now()
		for i := range n {
			if _, err := lifelinev1.ParseTopic(topics[i]); err != nil {
				b.Fatal(err)
			}
			if err := proto.Unmarshal(payloads[i], &lifelinev1.WorkerState{}); err != nil {
				b.Fatal(err)
			}
		}
		decode := time.Since(start)
		rate, anchor := float64(n)/ingest.Seconds(), float64(n)/decode.Seconds()
		b.ReportMetric(rate, "states/s/core")
		b.ReportMetric(anchor, "anchor-states/s/core")
		fmt.Printf("\nWorker-state ingestion, one core (%d messages, 100 nodes x 10 workers)\n", n)
		fmt.Printf("  %-48s %10.0f msg/s\n", "Lifeline: parse, decode, check, table, notify", rate)
		fmt.Printf("  %-48s %10.0f msg/s\n", "anchor: parse and decode only", anchor)
		fmt.Printf("  ratio Lifeline/anchor: %.2fx   goal: >= 20000 msg/s/core\n", rate/anchor)
	}
}

// BenchmarkTableUnderFlood has one node send a flood of every kind of message an attacker can: states of pods
// the API server does not know, results and reports for another node's pods, its own local results and reports
// for as many workers as it likes. It reports the records the table holds against the messages sent (the
// anchor: without bounds, one record each).
func BenchmarkTableUnderFlood(b *testing.B) {
	const perKind = 4000
	for range b.N {
		bn := newBench(b)
		now := time.Unix(1000, 0)
		bn.cutOff("edge1", now)
		bn.addPod("edge2", "default", "victim", "v")
		for i := range perKind {
			name := fmt.Sprintf("w%d", i)
			bn.pods[podRef{"default", name}] = PodInfo{Node: "edge1", UID: name, Worker: name, OwnerKind: "FederatedLearningJob", OwnerName: name}
		}
		sent := 0
		for i := range perKind {
			name := fmt.Sprintf("w%d", i)
			bn.state("edge1", &lifelinev1.WorkerState{Namespace: "default", Name: fmt.Sprintf("fake-%d", i), Uid: "u", Seq: 1}, now)
			bn.result("edge1", &lifelinev1.CommandResult{CommandId: "local/1", Namespace: "default", Pod: "victim", PodUid: "v", Local: true}, now)
			bn.result("edge1", &lifelinev1.CommandResult{CommandId: fmt.Sprintf("local/report/x/u/%d", i), Namespace: "default", Pod: name, PodUid: name, Local: true}, now)
			bn.report("edge1", uint64(i+1), "default", name,
				fmt.Sprintf(`{"name":%q,"namespace":"default","ownerName":%q,"ownerKind":"federatedlearningjob"}`, name, name), now)
			sent += 4
		}
		held := bn.workers("edge1") + len(bn.tr.sent)
		for _, r := range bn.tr.actions {
			held += len(r)
		}
		for _, r := range bn.tr.reports {
			held += len(r)
		}
		b.ReportMetric(float64(held), "records-held")
		b.ReportMetric(float64(sent), "anchor-messages-sent")
		fmt.Printf("\nTable under a flood from one node (%d messages of 4 kinds): %d records held\n", sent, held)
	}
}
