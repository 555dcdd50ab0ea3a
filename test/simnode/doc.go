// Package simnode holds the simulated nodes, for tests that need a node without a container runtime:
//
//   - the hollow KubeEdge edge node (Node, run by lifeline-edgesim): it registers a Node with KubeEdge's labels,
//     keeps it Ready, runs the containers of the pods bound to it as local processes (an image maps to an
//     executable), reports their status through the API as edged does, serves the MetaServer and the CRI subset
//     the agent uses, and keeps its pods on disk so that it runs them again after its own restart, even while the
//     API server cannot be reached;
//   - the API-only kubelet of cloud and controller-test nodes (StartKubelet), as upstream controller integration
//     tests have: it keeps its nodes Ready and their Leases fresh, reports every pod bound to them running and
//     ready, and finishes graceful deletions; it runs no containers;
//   - a fake CRI runtime (StartCRI) on a real unix socket, with containers a test sets, for the agent's own tests;
//   - what every kubelet does for its node: register it, keep its Ready condition and its Lease fresh.
package simnode
