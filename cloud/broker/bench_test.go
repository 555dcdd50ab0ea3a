package broker

import (
	"crypto/rand"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"google.golang.org/protobuf/proto"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// benchAgents is how many well-behaved agents stay connected through every attack.
const benchAgents = 10

// attackRig is a broker with benchAgents connected agents and credentials for a few more nodes.
type attackRig struct {
	*rig
	agents []mqtt.Client
}

func startAttackRig(b *testing.B, limits Limits) *attackRig {
	b.Helper()
	passwords := map[string]string{}
	for i := range benchAgents + 20 {
		passwords[fmt.Sprintf("node-%d", i)] = fmt.Sprintf("pw-%d", i)
	}
	r := &attackRig{rig: startBroker(b, nil, limits, passwords)}
	for i := range benchAgents {
		c, err := r.connect(fmt.Sprintf("node-%d", i), fmt.Sprintf("pw-%d", i), "")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Disconnect(0) })
		r.agents = append(r.agents, c)
	}
	return r
}

// heapMiB is the heap and the goroutine stacks in use after a collection: what connections hold.
func heapMiB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse+m.StackInuse) / (1 << 20)
}

// publishLatency is the median and the 99th percentile of the agents' QoS 1 heartbeats, publish to
// acknowledgement, in milliseconds, over n of them round-robin.
func (r *attackRig) publishLatency(b *testing.B, n int) (p50, p99 float64) {
	b.Helper()
	payload, _ := proto.Marshal(&lifelinev1.Heartbeat{BirthSeq: 1, Seq: 1, TimeUnixNano: time.Now().UnixNano()})
	var took []time.Duration
	for i := range n {
		node := fmt.Sprintf("node-%d", i%benchAgents)
		start := time.Now()
		tok := r.agents[i%benchAgents].Publish(lifelinev1.NodeTopic("c", node, lifelinev1.KindHeartbeat).String(), 1, false, payload)
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			b.Fatalf("a legitimate agent could not publish: %v", tok.Error())
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return ms(took[n/2]), ms(took[n*99/100])
}

// refused sums the broker's refusals of the given reasons.
func (r *attackRig) refused(reasons ...string) float64 {
	var n float64
	for _, reason := range reasons {
		n += r.count(dropped, reason)
	}
	return n
}

// report prints and records one attack's figures beside the idle anchor of the same broker.
func report(b *testing.B, name string, idleHeap, attackHeap, idleP99, attackP99 float64, extra map[string]float64) {
	b.ReportMetric(idleHeap, "anchor-heap+stacks-MiB")
	b.ReportMetric(attackHeap, "heap+stacks-MiB")
	b.ReportMetric(idleP99, "anchor-p99-ms")
	b.ReportMetric(attackP99, "p99-ms")
	fmt.Printf("\n%s\n  heap and stacks in use: %.1f MiB under attack, %.1f MiB idle (same broker, %d agents connected)\n"+
		"  agents' QoS 1 publish, p99: %.2f ms under attack, %.2f ms idle\n", name, attackHeap, idleHeap, benchAgents, attackP99, idleP99)
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.ReportMetric(extra[k], k)
		fmt.Printf("  %s: %.0f\n", k, extra[k])
	}
}

// BenchmarkBrokerUnderAttack runs each attack on the embedded broker (default limits, a 2 s CONNECT deadline to
// keep it short) while benchAgents agents keep publishing, all on 127.0.0.1, each bounded in count and time.
func BenchmarkBrokerUnderAttack(b *testing.B) {
	const deadline = 2 * time.Second
	limits := Limits{ConnectTimeout: deadline}

	// 1,000 TCP connections that never send a CONNECT: as many as the default sessions' limit.
	b.Run("idle-connections", func(b *testing.B) {
		for range b.N {
			r := startAttackRig(b, limits)
			idleHeap := heapMiB()
			_, idleP99 := r.publishLatency(b, 300)
			var conns []net.Conn
			for range 1000 {
				c, err := net.Dial("tcp", r.addr)
				if err != nil {
					b.Fatal(err)
				}
				conns = append(conns, c)
			}
			testkit.Until(b, 5*time.Second, "the connections accepted or evicted", func() bool {
				return r.broker.listener.open()+int(r.refused(RefusedPreAuthEvicted)) == benchAgents+1000
			})
			attackHeap := heapMiB()
			held := r.broker.listener.open() - benchAgents
			_, attackP99 := r.publishLatency(b, 300)
			late, err := r.connect(fmt.Sprintf("node-%d", benchAgents), fmt.Sprintf("pw-%d", benchAgents), "")
			if err != nil {
				b.Fatalf("an agent could not log in during the attack: %v", err)
			}
			late.Disconnect(0)
			// Each connection is closed at its deadline: those the broker has not closed a second past it, it holds.
			closedBy, after := time.Now().Add(deadline+time.Second), 0
			for _, c := range conns {
				if !closedByServer(b, c, max(time.Until(closedBy), 10*time.Millisecond)) {
					after++
				}
				c.Close()
			}
			// The broker counts a connection closed at its deadline once it has let it go, after the close.
			testkit.Until(b, 5*time.Second, "each connection evicted, counted as closed at its deadline, or held", func() bool {
				return int(r.refused(RefusedPreAuthEvicted)+r.refused(RefusedConnectTimeout))+after == len(conns)
			})
			report(b, "1,000 connections that never send a CONNECT", idleHeap, attackHeap, idleP99, attackP99, map[string]float64{
				"held-during":         float64(held),
				"held-after-deadline": float64(after),
				"evicted":             r.refused(RefusedPreAuthEvicted),
				"closed-at-deadline":  r.refused(RefusedConnectTimeout),
			})
		}
	})

	// 2,000 connections each sending 1 KiB of random bytes.
	b.Run("garbage", func(b *testing.B) {
		for range b.N {
			r := startAttackRig(b, limits)
			idleHeap := heapMiB()
			_, idleP99 := r.publishLatency(b, 300)
			var wg sync.WaitGroup
			var made atomic.Int64
			for w := range 8 {
				wg.Go(func() {
					garbage := make([]byte, 1<<10)
					for range 250 {
						_, _ = rand.Read(garbage)
						garbage[0] = byte(0x20 + w) // never a CONNECT
						c, err := net.Dial("tcp", r.addr)
						if err != nil {
							continue
						}
						if _, err := c.Write(garbage); err == nil {
							made.Add(1)
						}
						closedByServer(b, c, 5*time.Second)
						c.Close()
					}
				})
			}
			_, attackP99 := r.publishLatency(b, 300)
			wg.Wait()
			attackHeap := heapMiB()
			testkit.Until(b, 5*time.Second, "every garbage connection counted", func() bool {
				return r.refused(RefusedMalformed, RefusedTooLarge) >= float64(made.Load())
			})
			report(b, "2,000 connections sending 1 KiB of garbage", idleHeap, attackHeap, idleP99, attackP99, map[string]float64{
				"garbage-connections": float64(made.Load()),
				"refused-malformed":   r.refused(RefusedMalformed, RefusedTooLarge),
			})
		}
	})

	// 200 CONNECTs announcing 48 MiB each, 8 at a time.
	b.Run("oversized-connect", func(b *testing.B) {
		for range b.N {
			r := startAttackRig(b, limits)
			idleHeap := heapMiB()
			_, idleP99 := r.publishLatency(b, 300)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 25 {
						c, err := net.Dial("tcp", r.addr)
						if err != nil {
							continue
						}
						_, _ = c.Write(append(connectHeader(48<<20), make([]byte, 64<<10)...))
						closedByServer(b, c, 5*time.Second)
						c.Close()
					}
				})
			}
			_, attackP99 := r.publishLatency(b, 300)
			wg.Wait()
			runtime.ReadMemStats(&after)
			attackHeap := heapMiB()
			testkit.Until(b, 5*time.Second, "every oversized CONNECT counted", func() bool { return r.refused(RefusedTooLarge) == 200 })
			report(b, "200 CONNECTs announcing 48 MiB", idleHeap, attackHeap, idleP99, attackP99, map[string]float64{
				"allocated-KiB-per-attack": float64(after.TotalAlloc-before.TotalAlloc) / 200 / (1 << 10),
				"refused-too-large":        r.refused(RefusedTooLarge),
			})
		}
	})

	// 20 authenticated agents that subscribe to their commands and then never read nor acknowledge, while the
	// controller sends each of them 500 commands of 1 KiB.
	b.Run("slow-readers", func(b *testing.B) {
		for range b.N {
			r := startAttackRig(b, limits)
			idleHeap := heapMiB()
			_, idleP99 := r.publishLatency(b, 300)
			for i := range 20 {
				rawSession(b, r.addr, fmt.Sprintf("node-%d", benchAgents+i), fmt.Sprintf("pw-%d", benchAgents+i))
			}
			command := make([]byte, 1<<10)
			start, failed := time.Now(), 0
			for range 500 {
				for i := range 20 {
					if r.broker.PublishCommand(fmt.Sprintf("node-%d", benchAgents+i), command) != nil {
						failed++
					}
				}
			}
			perCommand := time.Since(start) / 10000
			_, attackP99 := r.publishLatency(b, 300)
			attackHeap := heapMiB()
			report(b, "20 agents that never read, 500 commands of 1 KiB each", idleHeap, attackHeap, idleP99, attackP99, map[string]float64{
				"command-publish-us": float64(perCommand) / float64(time.Microsecond),
				"commands-refused":   float64(failed),
				"refusals-counted":   r.refused(RefusedSlowClient),
			})
		}
	})
}

// BenchmarkLoginThroughAChurn prints how six agents at round trips of 50 to 300 ms log in by certificate through a
// churn of connections that never finish their TLS handshake: from addresses of their own (the broker Service's
// externalTrafficPolicy Local); from the churn's own address (Cluster: one node's address hides every source),
// resuming the TLS sessions of a login before the churn; and, the anchor, from the churn's address without.
func BenchmarkLoginThroughAChurn(b *testing.B) {
	one := []string{"127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1"}
	for _, c := range []struct {
		name    string
		sources []string
		resume  bool
	}{
		{"own-addresses", []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7"}, false},
		{"one-address-resuming", one, true},
		{"anchor-one-address", one, false},
	} {
		got := loginUnderChurn(b, startCertRigWith(b, nil, Limits{}), c.sources, c.resume)
		slowest := time.Duration(0)
		if len(got.took) > 0 {
			slowest = got.took[len(got.took)-1]
		}
		fmt.Printf("\nlogin-through-a-churn %s: %d of 6 agents in (round trips 50-300 ms), the slowest after %.2f s, churn %.0f connections/s\n",
			c.name, got.loggedIn, slowest.Seconds(), got.churnPerS)
		b.ReportMetric(float64(got.loggedIn), c.name+"-agents-in")
	}
}
