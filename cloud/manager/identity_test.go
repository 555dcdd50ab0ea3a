package manager_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/lifeline-edge/lifeline/cloud/broker"
	"github.com/lifeline-edge/lifeline/cloud/manager"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// controller runs Lifeline's manager with its embedded broker on TLS, admitting nodes by certificates of ca.
type controller struct {
	addr  string
	roots *x509.CertPool
}

func startController(t *testing.T, ca *testkit.CA) *controller {
	t.Helper()
	serverCA := testkit.NewCA(t, "lifeline-broker")
	serverCert := serverCA.Issue(t, testkit.CertOptions{CommonName: "lifeline-broker", NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	mgr, err := manager.New(cp.Config, manager.Options{MetricsAddr: "0", HealthAddr: "0", Restartable: true,
		MQTTAddress: addr, MQTTTLS: &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12},
		MQTTClientCAs: ca.Pool(), MQTTCredentialsDir: t.TempDir(), Cluster: "c"})
	if err != nil {
		t.Fatal(err)
	}
	runManager(t, mgr)
	return &controller{addr: addr, roots: serverCA.Pool()}
}

// login connects as node's agent with cert; lost is closed when the session ends.
func (c *controller) login(t *testing.T, node string, cert tls.Certificate) (mqtt.Client, <-chan struct{}, error) {
	t.Helper()
	lost := make(chan struct{})
	opts := mqtt.NewClientOptions().AddBroker("ssl://" + c.addr).SetClientID(lifelinev1.AgentClientID(node)).
		SetTLSConfig(&tls.Config{RootCAs: c.roots, MinVersion: tls.VersionTLS12,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }}).
		SetAutoReconnect(false).SetProtocolVersion(4).SetConnectionLostHandler(func(mqtt.Client, error) { close(lost) })
	cl := mqtt.NewClient(opts)
	tok := cl.Connect()
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		return nil, nil, fmt.Errorf("connecting as %s: %v", node, tok.Error())
	}
	t.Cleanup(func() { cl.Disconnect(0) })
	return cl, lost, nil
}

func nodeCert(t *testing.T, ca *testkit.CA, node string) tls.Certificate {
	return ca.Issue(t, testkit.CertOptions{CommonName: "system:node:" + node, Organization: []string{"system:nodes"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
}

func createNode(t *testing.T, name string, labels map[string]string) *corev1.Node {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := kube.Create(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.Delete(context.Background(), node) })
	return node
}

// tableNodes is how many nodes the liveness table holds a record of; -1 when the metric is not served.
func tableNodes(t *testing.T) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "lifeline_liveness_nodes" && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// dropped is the count of connections and messages the broker refused for reason.
func dropped(t *testing.T, reason string) float64 {
	v, _ := counter(t, "lifeline_liveness_dropped_total", "reason", reason)
	return v
}

// counter is the value of the controller's counter name in its sample labelled label=value; false when it has
// none (a counter never incremented has no sample).
func counter(t *testing.T, name, label, value string) (float64, bool) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// [P-AUTH-6] A node's certificate admits it only while the API server has an edge Node of its name, as the
// controller's cache shows it; deleting the Node, or taking its edge label away, ends its live session at once,
// and the liveness table forgets the node, so Nodes come and gone never fill it.
func TestNodeIdentityIsCheckedAgainstTheAPIServer_P_AUTH_6(t *testing.T) {
	ca := testkit.NewCA(t, "kubeedge")
	c := startController(t, ca)
	createNode(t, "edge-a", map[string]string{broker.EdgeNodeLabel: ""})
	createNode(t, "edge-b", map[string]string{broker.EdgeNodeLabel: ""})
	createNode(t, "cloud-a", map[string]string{"node-role.kubernetes.io/worker": ""})

	// The broker starts once the cache has synced; the first edge node's login says it is up.
	var agentA mqtt.Client
	var lostA <-chan struct{}
	testkit.Until(t, 10*time.Second, "edge-a admitted by its certificate", func() bool {
		cl, lost, err := c.login(t, "edge-a", nodeCert(t, ca, "edge-a"))
		agentA, lostA = cl, lost
		return err == nil
	})
	// Its agent's birth gives edge-a a record in the liveness table.
	birth, err := proto.Marshal(&lifelinev1.NodeBirth{Node: "edge-a", BirthSeq: 1, StateId: "state", BootId: "boot"})
	if err != nil {
		t.Fatal(err)
	}
	if tok := agentA.Publish(lifelinev1.NodeTopic("c", "edge-a", lifelinev1.KindBirth).String(), 1, false, birth); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publishing edge-a's birth: %v", tok.Error())
	}
	testkit.Until(t, 10*time.Second, "edge-a in the liveness table", func() bool { return tableNodes(t) == 1 })
	before := dropped(t, broker.RefusedNotEdgeNode)
	if _, _, err := c.login(t, "ghost", nodeCert(t, ca, "ghost")); err == nil {
		t.Error("a certificate of a node the API server does not have was admitted")
	}
	if _, _, err := c.login(t, "cloud-a", nodeCert(t, ca, "cloud-a")); err == nil {
		t.Error("a certificate of a Node that is not an edge node was admitted")
	}
	testkit.Until(t, 10*time.Second, "both refusals counted", func() bool { return dropped(t, broker.RefusedNotEdgeNode) == before+2 })

	// A Node created later is admitted as soon as the cache has it.
	createNode(t, "edge-late", map[string]string{broker.EdgeNodeLabel: ""})
	testkit.Until(t, 10*time.Second, "edge-late admitted once its Node exists", func() bool {
		_, _, err := c.login(t, "edge-late", nodeCert(t, ca, "edge-late"))
		return err == nil
	})

	// Deleting edge-a's Node ends its session; its certificate no longer admits it.
	if err := kube.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-a"}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lostA:
	case <-time.After(5 * time.Second): // well within the broker's 10 s recheck: the watch ended it
		t.Fatal("edge-a's session outlived its Node")
	}
	testkit.Until(t, 10*time.Second, "edge-a forgotten by the liveness table", func() bool { return tableNodes(t) == 0 })
	testkit.Until(t, 10*time.Second, "edge-a refused without its Node", func() bool {
		_, _, err := c.login(t, "edge-a", nodeCert(t, ca, "edge-a"))
		return err != nil
	})

	// Taking edge-b's edge label away ends its session too.
	_, lostB, err := c.login(t, "edge-b", nodeCert(t, ca, "edge-b"))
	if err != nil {
		t.Fatal(err)
	}
	nodeB := &corev1.Node{}
	if err := kube.Get(context.Background(), client.ObjectKey{Name: "edge-b"}, nodeB); err != nil {
		t.Fatal(err)
	}
	delete(nodeB.Labels, broker.EdgeNodeLabel)
	if err := kube.Update(context.Background(), nodeB); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lostB:
	case <-time.After(5 * time.Second):
		t.Fatal("edge-b's session outlived its edge label")
	}
}
