// Package testkit is what tests of every layer share, none of it a node or a cluster:
//
//   - waiting: Until and its kin ask a condition every 20 ms until it holds or the time is up, then fail the test,
//     naming what it waited for and why the condition last said no. A test that can be told (a channel, an
//     event, a counter) waits on that instead; none waits a fixed time.
//   - certificates: a CA, and node certificates shaped as KubeEdge's cloudcore issues them (an ECDSA P-256 key in
//     an `EC PRIVATE KEY` block), so TLS handshakes in tests are real ones.
//   - an embedded mochi-mqtt broker, and a subscription to what the agents publish.
//   - Proxy, a TCP proxy a test can cut and restore: the link between a simulated node and the API server or the
//     broker. A cut closes the live connections and refuses new ones, as a partition looks to both ends once TCP
//     has given up; a blackhole passes nothing and closes nothing, as a partition looks until then.
//   - the fixtures: Sedna-format YAML for tests and the demo, Lifeline's own examples in deploy/examples (always
//     present) and, when a copy is at hand, upstream Sedna's examples as they are.
package testkit
