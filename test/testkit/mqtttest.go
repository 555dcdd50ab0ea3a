package testkit

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// StartBroker runs a broker that allows everyone on a free loopback port, with the given hooks besides, and
// returns its address.
func StartBroker(t testing.TB, hooks ...mochi.Hook) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	server := mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, h := range append([]mochi.Hook{new(auth.AllowHook)}, hooks...) {
		if err := server.AddHook(h, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := server.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: addr})); err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve() }()
	t.Cleanup(func() { server.Close() })
	return addr
}

// Message is a received message with its parsed topic.
type Message struct {
	Topic   lifelinev1.Topic
	Payload []byte
	At      time.Time
}

// Subscribe reads everything the nodes of cluster publish, retained messages included.
func Subscribe(t testing.TB, broker, cluster, clientID string) <-chan Message {
	t.Helper()
	ch := make(chan Message, 10000)
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + broker).SetClientID(clientID))
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber connect: %v", tok.Error())
	}
	tok := c.Subscribe(lifelinev1.ControllerFilter(cluster), 1, func(_ mqtt.Client, m mqtt.Message) {
		topic, err := lifelinev1.ParseTopic(m.Topic())
		if err != nil {
			t.Errorf("unparsable topic %q", m.Topic())
			return
		}
		ch <- Message{Topic: topic, Payload: append([]byte(nil), m.Payload()...), At: time.Now()}
	})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return ch
}

// FreePort is a port on 127.0.0.1 nothing listens on now.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// StartMosquitto runs a mosquitto broker (the Debian package) that allows everyone, with the given extra
// configuration, and returns its address; it skips the test where mosquitto is not installed, outside CI.
func StartMosquitto(t testing.TB, name, extra string) string {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("mosquitto is not installed; .ci/run installs it")
		}
		t.Skip("mosquitto is not installed (apt-get install mosquitto)")
	}
	port := FreePort(t)
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
	UntilErr(t, 5*time.Second, "mosquitto "+name+" listening on "+addr, func(context.Context) (bool, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false, err
		}
		return true, c.Close()
	})
	return addr
}
