// Package mqtttest runs an embedded mochi-mqtt broker for tests and subscribes to what the agents publish.
package mqtttest

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// StartBroker runs a broker that allows everyone on a free loopback port and returns its address.
func StartBroker(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	server := mochi.New(&mochi.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := server.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
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
