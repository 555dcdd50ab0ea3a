package publisher

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/edge/journal"
	"github.com/lifeline-edge/lifeline/test/mqtttest"
	"github.com/lifeline-edge/lifeline/test/netproxy"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startMosquitto runs a mosquitto broker with the given extra configuration and returns its address.
func startMosquitto(t *testing.T, name, extra string) string {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("mosquitto is not installed; .ci/run installs it")
		}
		t.Skip("mosquitto is not installed (apt-get install mosquitto)")
	}
	port := freePort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, name+".conf")
	text := fmt.Sprintf("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\n%s", port, extra)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", conf)
	logFile, _ := os.Create(filepath.Join(dir, name+".log"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
	}
	t.Fatalf("mosquitto %s did not start", name)
	return ""
}

// The agent publishes to a mosquitto on its node, bridged to the cloud's mosquitto. The bridge is cut and
// restored: everything arrives, in order.
func TestMosquittoBridgeCarriesTheJournalAcrossACut(t *testing.T) {
	cloud := startMosquitto(t, "cloud", "")
	bridgeLink, err := netproxy.Start(cloud)
	if err != nil {
		t.Fatal(err)
	}
	defer bridgeLink.Close()
	edge := startMosquitto(t, "edge", fmt.Sprintf(`connection cloud
address %s
topic lifeline/# out 1
cleansession false
restart_timeout 1
notifications false
`, bridgeLink.Addr()))
	received := mqtttest.Subscribe(t, cloud, "c", "controller")

	dir := t.TempDir()
	j, err := journal.Open(filepath.Join(dir, "journal.db"), 1000)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	p := New(Config{Broker: "tcp://" + edge, Cluster: "c", Node: "edge-1", StateDir: dir,
		RetryInterval: 100 * time.Millisecond, Log: logr.Discard()}, j)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Run(ctx)

	for i := 1; i <= 5; i++ {
		if err := p.Enqueue(report(i)); err != nil {
			t.Fatal(err)
		}
	}
	if reports, _, _ := collect(t, received, 5, 15*time.Second); fmt.Sprint(reports) != fmt.Sprint(seq(1, 5)) {
		t.Fatalf("through the bridge: %v", reports)
	}
	bridgeLink.Cut()
	for i := 6; i <= 30; i++ {
		if err := p.Enqueue(report(i)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	bridgeLink.Restore()
	if reports, _, _ := collect(t, received, 30, 20*time.Second); fmt.Sprint(reports) != fmt.Sprint(seq(6, 30)) {
		t.Errorf("after the bridge came back: %v, want 6..30 in order", reports)
	}
}
