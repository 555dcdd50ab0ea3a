package simnode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one container of a pod, run as a local process.
type process struct {
	mu        sync.Mutex
	cmd       *exec.Cmd
	running   bool
	startedAt time.Time
	exited    chan struct{}
	exitCode  int
	finished  time.Time
}

// start runs argv with env, output appended to logPath, its pid written to pidPath; onExit, when set, is called
// once it ended. The child dies with the hollow node (as containers die with a rebooted node).
func startProcess(argv, env []string, dir, logPath, pidPath string, onExit func()) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log %s: %w", logPath, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = env, dir, logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	_ = os.WriteFile(pidPath, []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
	p := &process{cmd: cmd, running: true, startedAt: time.Now(), exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logFile.Close()
		code := 0
		if exitErr, ok := err.(*exec.ExitError); ok {
			code = exitErr.ExitCode()
			if code < 0 { // killed by a signal
				code = 128 + int(exitErr.Sys().(syscall.WaitStatus).Signal())
			}
		} else if err != nil {
			code = 1
		}
		p.mu.Lock()
		p.running, p.exitCode, p.finished = false, code, time.Now()
		p.mu.Unlock()
		close(p.exited)
		if onExit != nil {
			onExit()
		}
	}()
	return p, nil
}

// state returns whether the process runs, and its exit code and time once it ended.
func (p *process) state() (running bool, code int, startedAt, finished time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running, p.exitCode, p.startedAt, p.finished
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	if running, _, _, _ := p.state(); !running {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// kill sends SIGKILL to the process group and returns once the process ended; an ended process is left alone.
func (p *process) kill() {
	if running, _, _, _ := p.state(); !running {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// restamp sets the finish time of an ended process to at and tells whether it had ended.
func (p *process) restamp(at time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running {
		return false
	}
	p.finished = at
	return true
}

// PIDFile is where the hollow node writes the pid of a container's process, so tests and the demo can kill it.
func PIDFile(stateDir, namespace, pod, container string) string {
	return filepath.Join(stateDir, "pids", namespace+"_"+pod+"_"+container+".pid")
}

// LogFile is where a container's output goes.
func LogFile(stateDir, namespace, pod, container string) string {
	return filepath.Join(stateDir, "logs", namespace+"_"+pod+"_"+container+".log")
}

// ProcessRuns tells whether the process whose pid a pid file holds runs (and is not a zombie).
func ProcessRuns(pidFile string) bool {
	_, ok := ProcessOf(pidFile)
	return ok
}

// ProcessOf is the pid a pid file holds, when that process runs (and is not a zombie).
func ProcessOf(pidFile string) (int, bool) {
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid, err == nil && PIDRuns(pid)
}

// PIDRuns tells whether the process pid runs (and is not a zombie).
func PIDRuns(pid int) bool { return syscall.Kill(pid, 0) == nil && !isZombie(pid) }

func isZombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	fields := strings.Fields(string(data))
	return len(fields) > 2 && fields[2] == "Z"
}
