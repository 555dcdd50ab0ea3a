package agent_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/lifeline-edge/lifeline/edge/desired"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/simnode"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// BenchmarkAgentIdle runs the built lifeline-agent against a runtime with 10 running workers and an embedded
// broker, and measures its resident memory and CPU once idle, beside the anchor of an idle mosquitto broker in
// the same run; and the bytes on the wire of a heartbeat and of a worker state.
func BenchmarkAgentIdle(b *testing.B) {
	root, err := testkit.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	agentBin := filepath.Join(root, "bin", "lifeline-agent")
	if _, err := os.Stat(agentBin); err != nil {
		b.Fatalf("%s: run make build", agentBin)
	}
	dir := b.TempDir()
	rt, err := simnode.StartCRI(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Stop()
	// The agent learns its 10 workers from the file it keeps them in; no API server answers in this benchmark.
	var known []desired.Worker
	for i := 0; i < 10; i++ {
		rt.Set(simnode.CRIContainer{ID: fmt.Sprintf("c%d", i), PodNamespace: "default", PodName: fmt.Sprintf("worker-%d", i),
			PodUID: fmt.Sprintf("uid-%d", i), Name: "main", State: runtimeapi.ContainerState_CONTAINER_RUNNING})
		known = append(known, desired.Worker{Namespace: "default", Name: fmt.Sprintf("worker-%d", i), UID: fmt.Sprintf("uid-%d", i), Role: "trainer"})
	}
	stateDir := filepath.Join(dir, "state")
	data, _ := json.Marshal(known)
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, "desired-workers.json"), data, 0o600); err != nil {
		b.Fatal(err)
	}
	broker := testkit.StartBroker(b)
	received := testkit.Subscribe(b, broker, "production-eu", "bench")
	agent := exec.Command(agentBin, "--node-name=edge-node-0042", "--cluster=production-eu", "--broker=tcp://"+broker,
		"--state-dir="+stateDir, "--api-server=http://"+harness.FreeAddr(b), "--cri-socket="+rt.Socket, "--report-address="+harness.FreeAddr(b), "--metrics-address=")
	if err := agent.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = agent.Process.Kill(); _ = agent.Wait() }()

	anchor := startIdleMosquitto(b, dir)
	defer func() { _ = anchor.Process.Kill(); _ = anchor.Wait() }()

	// Start-up and the first states are not idle: the window opens once the agent has sent a state of each worker.
	var sent wire
	sent.readUntil(b, received, "state of each worker", func() bool { return len(sent.states) == len(known) })
	const window = 10 * time.Second
	agentCPU0, anchorCPU0 := cpuTicks(b, agent.Process.Pid), cpuTicks(b, anchor.Process.Pid)
	// The measurement window: CPU time is counted over a span of real time, which no event or fake clock stands
	// in for.
	time.Sleep(window)
	agentCPU := cpuShare(cpuTicks(b, agent.Process.Pid)-agentCPU0, window)
	anchorCPU := cpuShare(cpuTicks(b, anchor.Process.Pid)-anchorCPU0, window)
	agentRSS, anchorRSS := rssKiB(b, agent.Process.Pid), rssKiB(b, anchor.Process.Pid)

	sent.readUntil(b, received, "heartbeat", func() bool { return sent.heartbeat != 0 })
	hbBytes, wsBytes := sent.heartbeat, sent.workerState
	b.ReportMetric(float64(agentRSS)/1024, "agent-rss-MiB")
	b.ReportMetric(agentCPU*100, "agent-cpu-%core")
	b.ReportMetric(float64(hbBytes), "heartbeat-bytes")
	b.ReportMetric(float64(wsBytes), "worker-state-bytes")
	fmt.Printf("\nEdge agent idle with 10 running workers, measured over %v\n", window)
	fmt.Printf("  %-34s RSS %6.1f MiB   CPU %.3f %% of a core\n", "lifeline-agent", float64(agentRSS)/1024, agentCPU*100)
	fmt.Printf("  %-34s RSS %6.1f MiB   CPU %.3f %% of a core\n", "anchor: mosquitto, idle", float64(anchorRSS)/1024, anchorCPU*100)
	fmt.Printf("  ratio agent/mosquitto: RSS %.1fx\n", float64(agentRSS)/float64(max(anchorRSS, 1)))
	fmt.Printf("  on the wire (MQTT PUBLISH, topic included): heartbeat %d bytes, worker state %d bytes (goals: RSS <= 20 MiB, CPU <= 0.5 %%, heartbeat <= 100 bytes)\n",
		hbBytes, wsBytes)
}

// wire is what the agent sent: the MQTT PUBLISH sizes (fixed header, topic, packet id for QoS 1, payload) of its
// first heartbeat and worker state, and the workers it sent a state of.
type wire struct {
	heartbeat, workerState int
	states                 map[string]bool
}

// readUntil reads the agent's messages until done holds, for at most 10 s.
func (w *wire) readUntil(b *testing.B, ch <-chan testkit.Message, what string, done func() bool) {
	b.Helper()
	deadline := time.After(10 * time.Second)
	for !done() {
		select {
		case m := <-ch:
			topic := m.Topic.String()
			switch m.Topic.Kind {
			case lifelinev1.KindHeartbeat:
				hb := &lifelinev1.Heartbeat{}
				if w.heartbeat == 0 && proto.Unmarshal(m.Payload, hb) == nil {
					w.heartbeat = 2 + 2 + len(topic) + len(m.Payload)
				}
			case lifelinev1.KindWorkerState:
				if w.workerState == 0 {
					w.workerState = 2 + 2 + len(topic) + 2 + len(m.Payload)
				}
				if w.states == nil {
					w.states = map[string]bool{}
				}
				w.states[m.Topic.Namespace+"/"+m.Topic.Pod] = true
			}
		case <-deadline:
			b.Fatalf("no %s within 10 s: heartbeat %d bytes, worker state %d bytes, states of %d workers", what,
				w.heartbeat, w.workerState, len(w.states))
		}
	}
}

func startIdleMosquitto(b *testing.B, dir string) *exec.Cmd {
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		b.Fatal("the anchor needs mosquitto (apt-get install mosquitto)")
	}
	conf := filepath.Join(dir, "anchor.conf")
	port := strings.Split(harness.FreeAddr(b), ":")[1]
	if err := os.WriteFile(conf, []byte("listener "+port+" 127.0.0.1\nallow_anonymous true\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", conf)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return cmd
}

// cpuTicks is user+system time of a process in clock ticks (/proc/<pid>/stat fields 14 and 15).
func cpuTicks(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return utime + stime
}

// cpuShare turns ticks (100 per second on Linux) over a window into a share of one core.
func cpuShare(ticks int64, window time.Duration) float64 {
	return float64(ticks) / 100 / window.Seconds()
}

func rssKiB(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			v, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return v
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
