// Package harness starts what the integration and end-to-end tests run against, at three sizes:
//
//   - a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) from the
//     binaries `make tools` builds into bin/ (StartControlPlane, RunTests for a package's TestMain). Unlike
//     envtest it runs kube-controller-manager, so the garbage collector, the Deployment and ReplicaSet controllers
//     and the node lifecycle controller act on what Lifeline creates, as in a real cluster;
//   - the controllers' integration harness: that control plane with Lifeline's CRDs, the API-only kubelet of
//     test/simnode for the nodes the fixtures name, and Lifeline's manager running in the test process exactly as
//     cmd/lifeline-controller wires it; and helpers that make a workload's children as Sedna's GlobalManager did;
//   - the whole system on one machine as real processes (StartSim): the control plane, lifeline-controller, and
//     hollow edge nodes (lifeline-edgesim) running the sample workers. The e2e tests, the soak and `make demo` use
//     it.
package harness
