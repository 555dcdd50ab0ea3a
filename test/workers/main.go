// Command lifeline-sampleworker stands in for Sedna's worker images in the simulation. It honours the worker
// contract (environment, ports, the LC report API) with trivial "models", so the controllers, the hollow edge
// nodes and the agents can be exercised end to end without a container engine.
//
// Roles: ji-big (the cloud model), ji-little (the edge model), fl-aggregator, fl-trainer, given as the first
// argument or, in the sample images that stand in for Sedna's, by $LIFELINE_SAMPLE_ROLE (the pod's own args, such
// as an example's "-i 1", are then ignored). SIGUSR1 makes any of them exit 0.
//
// Given pause instead, it is the pod sandbox's process of the sample images for real nodes, as Kubernetes' pause:
// one binary stands in for every image those nodes would pull.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	role := os.Getenv("LIFELINE_SAMPLE_ROLE")
	if role == "" && len(os.Args) > 1 {
		role = os.Args[1]
	}
	if role == "" {
		fmt.Fprintln(os.Stderr, "usage: lifeline-sampleworker ji-big|ji-little|fl-aggregator|fl-trainer|pause (or $LIFELINE_SAMPLE_ROLE)")
		os.Exit(2)
	}
	// Before the roles' SIGUSR1 handler: the sandbox handles only the signals Kubernetes' pause handles.
	if role == pauseMode {
		pause()
		return
	}
	// SIGUSR1 ends any role successfully (exit 0), as a worker that finished or was told to quit would.
	done := make(chan os.Signal, 1)
	signal.Notify(done, syscall.SIGUSR1)
	go func() { <-done; os.Exit(0) }()
	env := contractEnv{get: os.Getenv, lookup: os.LookupEnv}
	var err error
	switch role {
	case "ji-big":
		err = runBigModel(env)
	case "ji-little":
		err = runLittleModel(env)
	case "fl-aggregator":
		err = runAggregator(env)
	case "fl-trainer":
		err = runTrainer(env)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lifeline-sampleworker:", err)
		os.Exit(1)
	}
}

// contractEnv reads the worker contract's variables.
type contractEnv struct {
	get    func(string) string
	lookup func(string) (string, bool)
}

// ownerName is the ownerName Sedna's library reports: JOB_NAME, which it defaults to "sedna" when unset, or
// SERVICE_NAME when JOB_NAME is set but empty. A JI worker's pod sets only SERVICE_NAME, so it reports "sedna".
func (e contractEnv) ownerName() string {
	job, set := e.lookup("JOB_NAME")
	if !set {
		job = "sedna"
	}
	if job != "" {
		return job
	}
	return e.get("SERVICE_NAME")
}

// workerName is WORKER_NAME, or what Sedna's library makes up without it: the owner name and a worker number.
func (e contractEnv) workerName() string {
	return e.or("WORKER_NAME", e.ownerName()+"-1")
}

func (e contractEnv) require(name string) (string, error) {
	v := e.get(name)
	if v == "" {
		return "", fmt.Errorf("%s is not set", name)
	}
	return v, nil
}

func (e contractEnv) or(name, fallback string) string {
	if v := e.get(name); v != "" {
		return v
	}
	return fallback
}
