// Command lifeline-nodes brings up, on this machine, a Kubernetes cluster of real nodes (a kubelet and a
// containerd each, see test/realnode) with Lifeline installed from its own images and Helm chart, for people
// trying Lifeline and for checks; then cuts, mends and reboots its nodes, and takes it all down.
//
//	lifeline-nodes up --dir D       control plane, nodes, Lifeline; prints KUBECONFIG=... and NODE=... lines
//	lifeline-nodes up --dir D --kubeedge   the edge nodes run KubeEdge's edgecore, as keadm join leaves it, with cloudcore
//	lifeline-nodes cut --dir D NODE api|broker|all
//	lifeline-nodes mend --dir D NODE
//	lifeline-nodes reboot --dir D NODE
//	lifeline-nodes down --dir D     every process, mount, network interface and file
//
// `up` leaves a supervisor running in the background that owns the cluster; the other commands ask it over a
// Unix socket in D.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lifeline-edge/lifeline/test/realnode"
)

const usage = `usage: lifeline-nodes up|cut|mend|reboot|down --dir D [args]
  up --dir D [--repo R] [--no-lifeline] [--kubeedge]   control plane, one cloud and two edge nodes, Lifeline installed;
      with --kubeedge the edge nodes run edgecore (as keadm join leaves it) beside cloudcore
  cut --dir D NODE api|broker|all
  mend --dir D NODE
  reboot --dir D NODE
  down --dir D`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	cmd := os.Args[1]
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	dir := fs.String("dir", "", "the cluster's directory (required)")
	repo := fs.String("repo", ".", "the Lifeline checkout whose release (dist/release, make images-nodes), examples and sample images are installed")
	bare := fs.Bool("no-lifeline", false, "bring up the nodes with the images, but leave installing Lifeline to you")
	kubeedge := fs.Bool("kubeedge", false, "edge nodes run KubeEdge's edgecore beside cloudcore (built by make tools from KubeEdge's source archive)")
	_ = fs.Parse(os.Args[2:])
	if *dir == "" {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		fail(err)
	}
	switch cmd {
	case "up":
		err = up(abs, *repo, *bare, *kubeedge)
	case "serve":
		err = serve(abs, *repo, *bare, *kubeedge)
	case "cut", "mend", "reboot", "down":
		err = ask(abs, append([]string{cmd}, fs.Args()...))
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "lifeline-nodes:", err)
	os.Exit(1)
}

func socketPath(dir string) string { return filepath.Join(dir, "control.sock") }
func readyPath(dir string) string  { return filepath.Join(dir, "ready") }
func logPath(dir string) string    { return filepath.Join(dir, "lifeline-nodes.log") }

// up starts the supervisor in the background and waits for it to say the cluster is ready, relaying its progress.
func up(dir, repo string, bare, kubeedge bool) error {
	if err := ask(dir, []string{"ping"}); err == nil {
		return fmt.Errorf("a cluster is already up in %s (lifeline-nodes down --dir %s)", dir, dir)
	}
	if err := realnode.CheckMachine(); err != nil {
		return err
	}
	if kubeedge {
		if err := realnode.CheckKubeEdge(filepath.Join(repo, "bin")); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_ = os.Remove(readyPath(dir))
	logFile, err := os.Create(logPath(dir))
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	repoAbs, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	sup := exec.Command(self, "serve", "--dir", dir, "--repo", repoAbs, fmt.Sprintf("--no-lifeline=%t", bare), fmt.Sprintf("--kubeedge=%t", kubeedge))
	sup.Stdout, sup.Stderr = logFile, logFile
	sup.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sup.Start(); err != nil {
		return fmt.Errorf("starting the supervisor: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- sup.Wait() }()
	fmt.Fprintf(os.Stderr, "==> bringing up real nodes in %s (progress in %s; cold: about 2 min)\n", dir, logPath(dir))
	shown := 0
	for {
		shown = relay(logPath(dir), shown)
		if ready, err := os.ReadFile(readyPath(dir)); err == nil {
			fmt.Print(string(ready))
			return nil
		}
		select {
		case err := <-exited:
			relay(logPath(dir), shown)
			return fmt.Errorf("the supervisor exited (%v); see %s", err, logPath(dir))
		case <-time.After(time.Second):
		}
	}
}

// relay copies the log's new lines to stderr and returns how many bytes have been shown.
func relay(path string, shown int) int {
	data, err := os.ReadFile(path)
	if err != nil || len(data) <= shown {
		return shown
	}
	end := strings.LastIndexByte(string(data), '\n') + 1
	if end <= shown {
		return shown
	}
	os.Stderr.Write(data[shown:end])
	return end
}

// ask sends one command to the supervisor and prints its answer.
func ask(dir string, words []string) error {
	conn, err := net.DialTimeout("unix", socketPath(dir), 2*time.Second)
	if err != nil {
		return fmt.Errorf("no cluster is up in %s: %w", dir, err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintln(conn, strings.Join(words, " ")); err != nil {
		return err
	}
	answer, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil && answer == "" {
		return fmt.Errorf("no answer from the supervisor: %w", err)
	}
	answer = strings.TrimSpace(answer)
	if msg, failed := strings.CutPrefix(answer, "error: "); failed {
		return errors.New(msg)
	}
	if words[0] != "ping" && answer != "ok" {
		fmt.Println(answer)
	}
	return nil
}

// serve owns the cluster: it brings it up, writes the ready file, and carries out commands until down.
func serve(dir, repo string, bare, kubeedge bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	nodes := realnode.DefaultNodes
	if kubeedge {
		nodes = realnode.WithDaemon(nodes, realnode.RoleEdge, realnode.DaemonEdgecore)
	}
	release, err := realnode.FindRelease(repo)
	if err != nil {
		return err
	}
	c, err := realnode.Start(ctx, realnode.Options{Dir: dir, Nodes: nodes, Images: release.Images, Progress: os.Stdout})
	if err != nil {
		return err
	}
	defer c.Stop()
	if err := realnode.PlaceExampleFiles(c); err != nil {
		return err
	}
	inst := &realnode.Installation{BrokerPort: realnode.BrokerNodePort}
	if !bare {
		if inst, err = realnode.InstallLifeline(ctx, c, realnode.InstallOptions{Chart: release.Chart, Progress: os.Stdout}); err != nil {
			return err
		}
	}
	_ = os.Remove(socketPath(dir))
	l, err := net.Listen("unix", socketPath(dir))
	if err != nil {
		return err
	}
	defer l.Close()
	var ready strings.Builder
	fmt.Fprintf(&ready, "KUBECONFIG=%s\n", c.Kubeconfig)
	for _, n := range c.Nodes {
		fmt.Fprintf(&ready, "NODE=%s ROLE=%s CRI=%s\n", n.Name, n.Role, n.CRISocket)
	}
	if err := os.WriteFile(readyPath(dir), []byte(ready.String()), 0o644); err != nil {
		return err
	}
	fmt.Println("ready")
	conns := make(chan net.Conn)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- conn
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case conn, ok := <-conns:
			if !ok {
				return nil
			}
			if down := carryOut(ctx, c, inst, conn); down {
				c.Stop()
				_ = os.RemoveAll(dir)
				fmt.Fprintln(conn, "ok")
				conn.Close()
				return nil
			}
		}
	}
}

// carryOut reads one command from conn and answers it; it returns true for down, which the caller answers.
func carryOut(ctx context.Context, c *realnode.Cluster, inst *realnode.Installation, conn net.Conn) (down bool) {
	line, _ := bufio.NewReader(conn).ReadString('\n')
	words := strings.Fields(line)
	var err error
	switch {
	case len(words) == 1 && words[0] == "ping":
	case len(words) == 1 && words[0] == "down":
		return true
	case len(words) == 3 && words[0] == "cut":
		err = c.Cut(ctx, words[1], realnode.Link(words[2]), inst.BrokerPort)
	case len(words) == 2 && words[0] == "mend":
		err = c.Mend(ctx, words[1])
	case len(words) == 2 && words[0] == "reboot":
		err = c.Reboot(ctx, words[1])
	default:
		err = fmt.Errorf("not understood: %q\n%s", strings.TrimSpace(line), usage)
	}
	if err != nil {
		fmt.Fprintf(conn, "error: %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
	} else {
		fmt.Fprintln(conn, "ok")
	}
	conn.Close()
	return false
}
