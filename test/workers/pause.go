package main

import (
	"os"
	"os/signal"
	"syscall"
)

// pauseMode is the mode that makes this binary the pod sandbox's process of the sample images for real nodes
// without a registry: their pause image runs it as the first argument of its entrypoint.
const pauseMode = "pause"

// pause is the pod sandbox's process, as Kubernetes' pause: it holds the pod's namespaces, reaps the orphans it
// inherits as the pod's init, and exits 0 when told to stop (SIGINT or SIGTERM).
func pause() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
