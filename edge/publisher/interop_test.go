package publisher

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

// The agent publishes to a mosquitto on its node, bridged to the cloud's mosquitto. The bridge is cut and
// restored: everything arrives, in order.
func TestMosquittoBridgeCarriesTheJournalAcrossACut(t *testing.T) {
	cloud := testkit.StartMosquitto(t, "cloud", "")
	bridgeLink, err := testkit.Start(cloud)
	if err != nil {
		t.Fatal(err)
	}
	defer bridgeLink.Close()
	edge := testkit.StartMosquitto(t, "edge", fmt.Sprintf(`connection cloud
address %s
topic lifeline/# out 1
cleansession false
restart_timeout 1
notifications false
`, bridgeLink.Addr()))
	received := testkit.Subscribe(t, cloud, "c", "controller")

	p, j := startPublisher(t, Config{Broker: "tcp://" + edge, RetryInterval: 100 * time.Millisecond})

	enqueueReports(t, p, 1, 5)
	if reports, _, _ := collect(t, received, 5, 15*time.Second); fmt.Sprint(reports) != fmt.Sprint(seq(1, 5)) {
		t.Fatalf("through the bridge: %v", reports)
	}
	bridgeLink.Cut()
	enqueueReports(t, p, 6, 30)
	// The edge's mosquitto acknowledged them all while its bridge was cut: they wait in its queue, not the journal.
	testkit.UntilErr(t, 10*time.Second, "the reports taken by the edge's mosquitto during the cut", drained(j))
	bridgeLink.Restore()
	// The bridge may deliver again a report whose acknowledgement the cut lost, as QoS 1 allows (the controller
	// drops it by its seq): only what was journaled during the cut must arrive, all of it, in order.
	reports, _, _ := collect(t, received, 30, 20*time.Second)
	reports = slices.DeleteFunc(reports, func(n int) bool { return n <= 5 })
	if fmt.Sprint(reports) != fmt.Sprint(seq(6, 30)) {
		t.Errorf("after the bridge came back: %v, want 6..30 in order", reports)
	}
}
