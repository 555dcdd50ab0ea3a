package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// needTool returns the path of a command on PATH; a missing one fails the test, or skips it with -short.
func needTool(t *testing.T, name, install string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if testing.Short() {
			t.Skipf("%s is not installed (%s)", name, install)
		}
		t.Fatalf("%s is not installed: %s", name, install)
	}
	return path
}

// Every shell script in the repository passes shellcheck.
func TestShellScriptsPassShellcheck(t *testing.T) {
	shellcheck := needTool(t, "shellcheck", "apt-get install shellcheck")
	out, err := exec.Command("git", "-C", "..", "ls-files", "--cached", "--others", "--exclude-standard", "*.sh").Output()
	if err != nil {
		t.Fatalf("listing the scripts: %v", err)
	}
	scripts := strings.Fields(string(out))
	if !slices.Contains(scripts, "deploy/kind/lifeline-on-kind.sh") {
		t.Fatalf("scripts %v: the kind script is not among them", scripts)
	}
	cmd := exec.Command(shellcheck, append([]string{"--external-sources"}, scripts...)...)
	cmd.Dir = ".."
	if report, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("shellcheck %v: %v\n%s", scripts, err, report)
	}
}

// shellWords splits a command line as the script prints it: words apart by spaces, single quotes taken
// literally (the script quotes nothing otherwise).
func shellWords(line string) []string {
	var words []string
	var word strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, word.String())
				word.Reset()
			}
			inWord = false
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words
}

// The kind script's dry run prints, and does not run, every command: a cluster, cloudcore advertised at the
// control plane, an edge node joined with the MetaServer on, KubeEdge's CA taken from its Secret, the images, and
// a helm install of this chart that renders, once the printed placeholders are filled, an agent dialling the
// broker at the control plane's address with its node's certificate.
func TestKindScriptDryRun(t *testing.T) {
	work := filepath.Join(t.TempDir(), "kind")
	cmd := exec.Command("bash", "kind/lifeline-on-kind.sh", "--dry-run")
	cmd.Env = append(os.Environ(), "LIFELINE_KIND_DIR="+work, "HELM=/nonexistent/helm")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("--dry-run: %v\n%s", err, stderr.String())
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("the dry run made its work directory (%v): it ran a command", err)
	}
	var commands [][]string
	var lines []string
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "+ "); ok {
			lines = append(lines, rest)
			commands = append(commands, shellWords(rest))
		}
	}
	find := func(prefix ...string) []string {
		t.Helper()
		for _, c := range commands {
			if len(c) >= len(prefix) && slices.Equal(c[:len(prefix)], prefix) {
				return c
			}
		}
		t.Fatalf("no command %v in the dry run:\n%s", prefix, out)
		return nil
	}
	has := func(c []string, args ...string) {
		t.Helper()
		for _, a := range args {
			if !slices.Contains(c, a) {
				t.Errorf("%v lacks %s", c, a)
			}
		}
	}

	find("kind", "create", "cluster")
	keadmInit := find(filepath.Join(work, "keadm"), "init")
	has(keadmInit, "--advertise-address=<cloud_ip>", "cloudCore.modules.dynamicController.enable=true")
	join := find("docker", "exec", "--env", "CHECK_EDGECORE_ENVIRONMENT=false", "lifeline-edge", "keadm", "join")
	has(join, "--cloudcore-ipport=<cloud_ip>:10000", "--token=<token>", "--edgenode-name=lifeline-edge",
		"modules.metaManager.metaServer.enable=true", "--remote-runtime-endpoint=unix:///run/containerd/containerd.sock")
	if !slices.ContainsFunc(lines, func(l string) bool {
		return strings.Contains(l, "-n kubeedge get secret casecret") && strings.Contains(l, "{.data.cadata}") &&
			strings.HasSuffix(l, "> "+filepath.Join(work, "kubeedge-ca.crt"))
	}) {
		t.Errorf("KubeEdge's CA is not taken from kubeedge/casecret's cadata into the work directory:\n%s", out)
	}
	root, _ := filepath.Abs("..")
	has(find("kind", "load", "image-archive"), filepath.Join(root, "dist/images/lifeline-controller.tar"))
	find("docker", "cp", filepath.Join(root, "dist/images/lifeline-agent.tar"))

	install := find("helm", "upgrade", "--install", "lifeline")
	chart := filepath.Join(root, "deploy/chart/lifeline")
	has(install, chart, "--namespace", "lifeline-system", "broker.advertiseAddress={<cloud_ip>}",
		"nodeIdentity.kubeedgeCA="+filepath.Join(work, "kubeedge-ca.crt"))

	// What that install would deploy, with the placeholders filled in.
	caFile, _ := testCA(t, "kubeedge")
	var flags []string
	for i := 4; i < len(install); i++ {
		switch a := install[i]; a {
		case chart, "--create-namespace", "--wait":
		case "--kubeconfig", "--timeout", "--namespace":
			i++
		default:
			a = strings.ReplaceAll(a, "<cloud_ip>", "172.18.0.2")
			flags = append(flags, strings.ReplaceAll(a, filepath.Join(work, "kubeedge-ca.crt"), caFile))
		}
	}
	in := newInstalled(t, renderChart(t, flags...))
	in.wantBroker(t, "ssl://172.18.0.2:30883")
	in.wantIssuedByController(t, "172.18.0.2")
	if c := in.agent.Spec.Template.Spec.Containers[0]; c.ImagePullPolicy != "Never" || c.Image != "lifeline/lifeline-agent:dev" {
		t.Errorf("agent image %s pulled %s, want the loaded lifeline/lifeline-agent:dev, never pulled", c.Image, c.ImagePullPolicy)
	}
}
