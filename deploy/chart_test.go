package deploy

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestChartLints(t *testing.T) {
	caFile, _ := testCA(t, "kubeedge")
	for _, flags := range [][]string{
		{"--set-file", "nodeIdentity.kubeedgeCA=" + caFile},
		{"--set", "nodeIdentity.mode=password", "--set", "broker.service.type=LoadBalancer"},
		{"--set-file", "nodeIdentity.kubeedgeCA=" + caFile, "--set", "controller.namespaces={team-a}", "--set", "broker.revokedCertificates.configMap=revoked",
			"--set", "agent.edgecore.requireAuthorization=true", "--set", "agent.datasetDirs={/data}"},
		{"--set", "nodeIdentity.mode=password", "--set", "controller.replicas=2", "--set", "imagePullSecrets[0].name=registry",
			"--set", "controller.priorityClassName=lifeline-critical", "--set", "controller.nodeSelector.pool=cloud",
			"--set", "controller.tolerations[0].key=dedicated", "--set", "controller.tolerations[0].operator=Exists",
			"--set", "controller.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=zone",
			"--set", "controller.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
			"--set", "agent.priorityClassName=system-node-critical", "--set", "agent.nodeSelector.kubernetes\\.io/arch=arm64"},
	} {
		if out, err := runHelm(t, append([]string{"lint", "--strict", chartDir}, flags...)...); err != nil {
			t.Errorf("helm lint %v: %v\n%s", flags, err, out)
		}
	}
}

// installed is what one rendering of the chart installs, as the objects users see.
type installed struct {
	objs       []*unstructured.Unstructured
	controller *appsv1.Deployment
	agent      *appsv1.DaemonSet
	service    *corev1.Service
}

func newInstalled(t *testing.T, objs []*unstructured.Unstructured) installed {
	t.Helper()
	return installed{objs: objs,
		controller: mustObject[appsv1.Deployment](t, objs, "Deployment", "lifeline-controller"),
		agent:      mustObject[appsv1.DaemonSet](t, objs, "DaemonSet", "lifeline-agent"),
		service:    mustObject[corev1.Service](t, objs, "Service", "lifeline-broker")}
}

// flag returns the value of --name=value in args, and whether it is there.
func flag(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name {
			return "", true
		}
	}
	return "", false
}

// mountedFrom returns the volume mounted at the directory holding path, and the path inside it.
func mountedFrom(pod corev1.PodSpec, c corev1.Container, path string) (corev1.Volume, corev1.VolumeMount, bool) {
	for _, m := range c.VolumeMounts {
		if path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			for _, v := range pod.Volumes {
				if v.Name == m.Name {
					return v, m, true
				}
			}
		}
	}
	return corev1.Volume{}, corev1.VolumeMount{}, false
}

// configMapFile returns the content of the ConfigMap key that path reads through its volume.
func (in installed) configMapFile(t *testing.T, pod corev1.PodSpec, c corev1.Container, path string) string {
	t.Helper()
	v, m, ok := mountedFrom(pod, c, path)
	if !ok || v.ConfigMap == nil || !m.ReadOnly {
		t.Fatalf("%s is not read from a ConfigMap mounted read-only (volume %+v)", path, v)
	}
	cm := mustObject[corev1.ConfigMap](t, in.objs, "ConfigMap", v.ConfigMap.Name)
	key := strings.TrimPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")
	data, ok := cm.Data[key]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s, which %s reads", cm.Name, key, path)
	}
	return data
}

func (in installed) wantKubeedgeCert(t *testing.T, caPEM string) {
	t.Helper()
	pod := in.controller.Spec.Template.Spec
	c := pod.Containers[0]
	caFile, ok := flag(c.Args, "mqtt-client-ca-file")
	if !ok {
		t.Fatalf("controller args %v: no --mqtt-client-ca-file", c.Args)
	}
	if got := in.configMapFile(t, pod, c, caFile); got != caPEM {
		t.Errorf("the controller's client CA %s holds\n%s\nwant KubeEdge's CA as given\n%s", caFile, got, caPEM)
	}
	if _, ok := flag(c.Args, "mqtt-credentials-dir"); ok {
		t.Errorf("controller args %v: passwords in certificate mode", c.Args)
	}
	apod := in.agent.Spec.Template.Spec
	a := apod.Containers[0]
	for flagName, want := range map[string]string{"cert-file": "/etc/kubeedge/certs/server.crt", "key-file": "/etc/kubeedge/certs/server.key"} {
		got, _ := flag(a.Args, flagName)
		if got != want {
			t.Errorf("agent --%s=%q, want %q", flagName, got, want)
		}
		v, m, ok := mountedFrom(apod, a, want)
		if !ok || v.HostPath == nil || v.HostPath.Path != "/etc/kubeedge/certs" || m.MountPath != "/etc/kubeedge/certs" || !m.ReadOnly {
			t.Errorf("agent reads %s from %+v mounted at %+v, want /etc/kubeedge/certs of the host, read-only", want, v, m)
		}
	}
	if _, ok := flag(a.Args, "password-file"); ok {
		t.Errorf("agent args %v: a password in certificate mode", a.Args)
	}
}

func (in installed) wantPasswords(t *testing.T) {
	t.Helper()
	pod := in.controller.Spec.Template.Spec
	c := pod.Containers[0]
	dir, ok := flag(c.Args, "mqtt-credentials-dir")
	v, _, mounted := mountedFrom(pod, c, dir)
	if !ok || !mounted || v.Secret == nil || v.Secret.SecretName != "lifeline-mqtt-credentials" {
		t.Errorf("controller --mqtt-credentials-dir=%q from volume %+v, want the Secret lifeline-mqtt-credentials", dir, v)
	}
	if _, ok := flag(c.Args, "mqtt-client-ca-file"); ok {
		t.Errorf("controller args %v: a client CA in password mode", c.Args)
	}
	if object[corev1.ConfigMap](t, in.objs, "ConfigMap", "lifeline-kubeedge-ca") != nil {
		t.Error("KubeEdge's CA rendered in password mode")
	}
	a := in.agent.Spec.Template.Spec.Containers[0]
	file, _ := flag(a.Args, "password-file")
	v, m, ok := mountedFrom(in.agent.Spec.Template.Spec, a, file)
	if file == "" || !ok || v.HostPath == nil || v.HostPath.Path != "/etc/lifeline/mqtt-password" || !m.ReadOnly {
		t.Errorf("agent --password-file=%q from %+v, want the node's /etc/lifeline/mqtt-password, read-only", file, v)
	}
	for _, f := range []string{"cert-file", "key-file"} {
		if _, ok := flag(a.Args, f); ok {
			t.Errorf("agent args %v: --%s in password mode", a.Args, f)
		}
	}
}

func (in installed) wantBroker(t *testing.T, url string) {
	t.Helper()
	a := in.agent.Spec.Template.Spec.Containers[0]
	if got, _ := flag(a.Args, "broker"); got != url {
		t.Errorf("agent --broker=%q, want %q", got, url)
	}
}

// wantIssuedByController checks that the controller makes the broker's CA and certificate at run time
// (broker.tls.generatedBy controller): it is told every advertised address and the Service's DNS names, the
// Secret of its CA is mounted into it (optional: it makes it on its first start), the agents read the CA from the
// ConfigMap it publishes, and the chart renders neither.
func (in installed) wantIssuedByController(t *testing.T, names ...string) {
	t.Helper()
	pod := in.controller.Spec.Template.Spec
	c := pod.Containers[0]
	if secret, _ := flag(c.Args, "mqtt-tls-ca-secret"); secret != "lifeline-broker-ca-key" {
		t.Errorf("controller --mqtt-tls-ca-secret=%q, want lifeline-broker-ca-key", secret)
	}
	if ns, _ := flag(c.Args, "mqtt-tls-namespace"); ns != namespace {
		t.Errorf("controller --mqtt-tls-namespace=%q, want %s", ns, namespace)
	}
	issued, _ := flag(c.Args, "mqtt-tls-names")
	for _, name := range append(names, "lifeline-broker", "lifeline-broker."+namespace+".svc") {
		if !slices.Contains(strings.Split(issued, ","), name) {
			t.Errorf("controller --mqtt-tls-names=%q lacks %s", issued, name)
		}
	}
	dir, _ := flag(c.Args, "mqtt-tls-ca-dir")
	v, m, ok := mountedFrom(pod, c, dir+"/tls.key")
	if !ok || v.Secret == nil || v.Secret.SecretName != "lifeline-broker-ca-key" || v.Secret.Optional == nil || !*v.Secret.Optional || !m.ReadOnly {
		t.Errorf("--mqtt-tls-ca-dir=%s is not the optional Secret lifeline-broker-ca-key, mounted read-only: %+v", dir, v)
	}
	a := in.agent.Spec.Template.Spec.Containers[0]
	caFile, _ := flag(a.Args, "ca-file")
	if v, _, ok := mountedFrom(in.agent.Spec.Template.Spec, a, caFile); !ok || v.ConfigMap == nil || v.ConfigMap.Name != "lifeline-broker-ca" {
		t.Errorf("the agents' --ca-file %s is not from the ConfigMap lifeline-broker-ca the controller publishes: %+v", caFile, v)
	}
	for _, o := range in.objs {
		if (o.GetKind() == "Secret" && strings.HasPrefix(o.GetName(), "lifeline-broker")) || (o.GetKind() == "ConfigMap" && o.GetName() == "lifeline-broker-ca") {
			t.Errorf("%s %s rendered: the controller makes it", o.GetKind(), o.GetName())
		}
	}
}

// wantGeneratedCert checks the broker's certificate generated by the chart (broker.tls.generatedBy helm): it parses,
// the CA the agents are given signs it, and it names every advertised address and the Service's DNS names, for a
// server.
func (in installed) wantGeneratedCert(t *testing.T, names ...string) *x509.Certificate {
	t.Helper()
	tls := mustObject[corev1.Secret](t, in.objs, "Secret", "lifeline-broker-tls")
	if v := in.controller.Spec.Template.Spec.Volumes; !slices.ContainsFunc(v, func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == tls.Name
	}) {
		t.Errorf("the controller does not mount %s: %+v", tls.Name, v)
	}
	block, _ := pem.Decode(tls.Data["tls.crt"])
	if block == nil {
		t.Fatalf("tls.crt is not PEM: %q", tls.Data["tls.crt"])
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("tls.crt: %v", err)
	}
	a := in.agent.Spec.Template.Spec.Containers[0]
	caFile, _ := flag(a.Args, "ca-file")
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM([]byte(in.configMapFile(t, in.agent.Spec.Template.Spec, a, caFile))) {
		t.Fatalf("the agents' --ca-file %s holds no certificate", caFile)
	}
	for _, name := range append(names, "lifeline-broker."+namespace+".svc") {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("an agent dialling %s would refuse the broker: %v", name, err)
		}
		if ip := net.ParseIP(name); ip != nil && !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			t.Errorf("certificate IPs %v lack %s", cert.IPAddresses, name)
		}
	}
	return cert
}

func TestChartRenders(t *testing.T) {
	caFile, caPEM := testCA(t, "kubeedge")
	_, userCA := testCA(t, "my-broker-ca")
	withCA := []string{"--set-file", "nodeIdentity.kubeedgeCA=" + caFile}
	cases := []struct {
		name  string
		flags []string
		check func(t *testing.T, in installed)
	}{{
		name:  "defaults",
		flags: withCA,
		check: func(t *testing.T, in installed) {
			in.wantKubeedgeCert(t, caPEM)
			in.wantBroker(t, "ssl://lifeline-broker.lifeline-system.svc:8883")
			in.wantIssuedByController(t, "lifeline-broker.lifeline-system", "lifeline-broker.lifeline-system.svc.cluster.local")
			if in.service.Spec.Type != corev1.ServiceTypeNodePort || in.service.Spec.Ports[0].NodePort != 30883 || in.service.Spec.Ports[0].Port != 8883 {
				t.Errorf("Service %+v, want NodePort 30883 to 8883", in.service.Spec)
			}
			c := in.controller.Spec.Template.Spec.Containers[0]
			if _, ok := flag(c.Args, "leader-elect"); ok || in.controller.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
				t.Errorf("one replica: args %v strategy %q, want no election and Recreate", c.Args, in.controller.Spec.Strategy.Type)
			}
			if c.Image != "lifeline/lifeline-controller:0.1.0" || in.agent.Spec.Template.Spec.Containers[0].Image != "lifeline/lifeline-agent:0.1.0" {
				t.Errorf("images %s, %s, want the appVersion tag", c.Image, in.agent.Spec.Template.Spec.Containers[0].Image)
			}
		},
	}, {
		name: "NodePort with advertised addresses",
		flags: append([]string{"--set", "broker.advertiseAddress={192.0.2.10,cloud.example.org,2001:db8::1}",
			"--set", "broker.service.nodePort=31000"}, withCA...),
		check: func(t *testing.T, in installed) {
			in.wantBroker(t, "ssl://192.0.2.10:31000")
			in.wantIssuedByController(t, "192.0.2.10", "cloud.example.org", "2001:db8::1")
			if in.service.Spec.Ports[0].NodePort != 31000 {
				t.Errorf("nodePort %d, want 31000", in.service.Spec.Ports[0].NodePort)
			}
		},
	}, {
		name: "LoadBalancer",
		flags: append([]string{"--set", "broker.service.type=LoadBalancer", "--set", "broker.advertiseAddress={mqtt.example.org}",
			"--set", "broker.port=8884", "--set", "broker.service.loadBalancerSourceRanges={198.51.100.0/24}"}, withCA...),
		check: func(t *testing.T, in installed) {
			in.wantBroker(t, "ssl://mqtt.example.org:8884")
			in.wantIssuedByController(t, "mqtt.example.org")
			s := in.service.Spec
			if s.Type != corev1.ServiceTypeLoadBalancer || s.Ports[0].NodePort != 0 || s.Ports[0].Port != 8884 ||
				!slices.Equal(s.LoadBalancerSourceRanges, []string{"198.51.100.0/24"}) {
				t.Errorf("Service %+v, want a LoadBalancer on 8884 from 198.51.100.0/24", s)
			}
			if got, _ := flag(in.controller.Spec.Template.Spec.Containers[0].Args, "mqtt-address"); got != ":8884" {
				t.Errorf("controller --mqtt-address=%q, want :8884", got)
			}
		},
	}, {
		name:  "a CA and certificate generated by the chart",
		flags: append([]string{"--set", "broker.tls.generatedBy=helm", "--set", "broker.advertiseAddress={192.0.2.10,cloud.example.org}"}, withCA...),
		check: func(t *testing.T, in installed) {
			in.wantGeneratedCert(t, "192.0.2.10", "cloud.example.org")
		},
	}, {
		name:  "password mode",
		flags: []string{"--set", "nodeIdentity.mode=password", "--set", "broker.advertiseAddress={192.0.2.10}"},
		check: func(t *testing.T, in installed) {
			in.wantPasswords(t)
			in.wantBroker(t, "ssl://192.0.2.10:30883")
		},
	}, {
		name: "existing secret, two replicas, extra args and tags",
		flags: append([]string{"--set", "broker.tls.existingSecret=my-broker-tls", "--set-file", "broker.tls.caCert=" + writeFile(t, userCA),
			"--set", "controller.replicas=2", "--set", "controller.extraArgs={--zap-log-level=2}",
			"--set", "agent.extraArgs={--v=2}", "--set", "controller.image.tag=v9", "--set", "agent.edgecore.metaServer=http://127.0.0.1:10551"}, withCA...),
		check: func(t *testing.T, in installed) {
			for _, name := range []string{"lifeline-broker-tls", "lifeline-broker-ca-key"} {
				if object[corev1.Secret](t, in.objs, "Secret", name) != nil {
					t.Errorf("Secret %s rendered beside an existing secret", name)
				}
			}
			pod := in.controller.Spec.Template.Spec
			c := pod.Containers[0]
			if v, _, ok := mountedFrom(pod, c, "/etc/lifeline/mqtt-tls/tls.crt"); !ok || v.Secret == nil || v.Secret.SecretName != "my-broker-tls" {
				t.Errorf("the broker's certificate comes from %+v, want Secret my-broker-tls", v)
			}
			a := in.agent.Spec.Template.Spec.Containers[0]
			caFile, _ := flag(a.Args, "ca-file")
			if got := in.configMapFile(t, in.agent.Spec.Template.Spec, a, caFile); got != userCA {
				t.Errorf("agents trust\n%s\nwant the given CA\n%s", got, userCA)
			}
			if ns, _ := flag(c.Args, "leader-election-namespace"); *in.controller.Spec.Replicas != 2 || ns != namespace ||
				in.controller.Spec.Strategy.Type == appsv1.RecreateDeploymentStrategyType {
				t.Errorf("two replicas: args %v, strategy %q, want leader election in %s and a rolling update", c.Args, in.controller.Spec.Strategy.Type, namespace)
			}
			if _, ok := flag(c.Args, "leader-elect"); !ok || !slices.Contains(c.Args, "--zap-log-level=2") || c.Image != "lifeline/lifeline-controller:v9" {
				t.Errorf("controller %s args %v, want --leader-elect and --zap-log-level=2, tag v9", c.Image, c.Args)
			}
			if api, _ := flag(a.Args, "api-server"); !slices.Contains(a.Args, "--v=2") || api != "http://127.0.0.1:10551" {
				t.Errorf("agent args %v, want --v=2 and the MetaServer at 10551", a.Args)
			}
		},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, newInstalled(t, renderChart(t, tc.flags...)))
		})
	}
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	f := t.TempDir() + "/file"
	if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// Values that cannot work fail the render with a message that says what to set. A value's type, enum or range is
// the schema's (TestChartRefusesMistypedValues); these are the rules it cannot say.
func TestChartRefusesValuesThatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{nil, "nodeIdentity.kubeedgeCA is required"},
		{[]string{"--set", "nodeIdentity.mode=password", "--set", "broker.advertiseAddress={192.0.2.1}", "--set", "broker.service.nodePort=null"}, "broker.service.nodePort is required"},
		{[]string{"--set", "nodeIdentity.mode=password", "--set", "broker.revokedCertificates.configMap=revoked"}, "only nodeIdentity.mode kubeedgeCert"},
		{[]string{"--set", "nodeIdentity.mode=password", "--set", "agent.datasetDirs={/}"}, `agent.datasetDirs holds "/"`},
		{[]string{"--set", "nodeIdentity.mode=password", "--set", "agent.datasetDirs={data}"}, `agent.datasetDirs holds "data"`},
		{[]string{"--set", "nodeIdentity.mode=password", "--set", "agent.datasetDirs={/data/../etc}"}, `agent.datasetDirs holds "/data/../etc"`},
	} {
		_, err := runHelm(t, append([]string{"template", "lifeline", chartDir, "--namespace", namespace}, tc.flags...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm template %v: %v, want an error saying %q", tc.flags, err, tc.want)
		}
	}
}

// The plain manifests are the chart's rendering, with the namespace and the CRDs, in password mode, taking the
// broker's certificate from a Secret the user creates.
func TestPlainManifestsAreTheChart(t *testing.T) {
	objs := readManifests(t)
	in := newInstalled(t, objs)
	in.wantPasswords(t)
	in.wantBroker(t, "ssl://lifeline-broker.lifeline-system.svc:8883")
	if mustObject[corev1.Namespace](t, objs, "Namespace", namespace) == nil {
		t.Fatal("no namespace")
	}
	crds := 0
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			crds++
		}
		if o.GetKind() == "Secret" {
			t.Errorf("the plain manifests hold Secret %s", o.GetName())
		}
	}
	if crds != 4 {
		t.Errorf("%d CRDs, want Sedna's four", crds)
	}
}

// Uninstalling releases the FL workers' finalizer: `helm uninstall` runs the controller's release subcommand
// first, stopping the controller; the plain manifests, applied by hand, never carry that Job.
func TestUninstallHookReleasesTheFinalizers(t *testing.T) {
	job := mustObject[batchv1.Job](t, renderChart(t, "--set", "nodeIdentity.mode=password"), "Job", "lifeline-release")
	if hook := job.Annotations["helm.sh/hook"]; hook != "pre-delete" {
		t.Errorf("hook %q, want pre-delete", hook)
	}
	pod := job.Spec.Template.Spec
	if pod.ServiceAccountName != "lifeline-controller" {
		t.Errorf("runs as %q, want the controller's service account", pod.ServiceAccountName)
	}
	args := pod.Containers[0].Args
	if len(args) == 0 || args[0] != "release" {
		t.Fatalf("args %v, want the release subcommand", args)
	}
	if v, _ := flag(args, "stop-deployment"); v != namespace+"/lifeline-controller" {
		t.Errorf("--stop-deployment=%q, want the controller's Deployment", v)
	}
	for _, o := range readManifests(t) {
		if o.GetKind() == "Job" {
			t.Errorf("the plain manifests hold Job %s, which would run at install", o.GetName())
		}
	}
}

// The controller's metrics are scraped the standard way: over HTTPS behind the API server's authentication and
// authorization (the controller may create TokenReviews and SubjectAccessReviews, scrapers get a ClusterRole for
// /metrics alone), through a Service; the Prometheus Operator's ServiceMonitor and alerts only when asked for.
func TestControllerMetricsAreServedTheStandardWay(t *testing.T) {
	objs := renderChart(t, "--set", "nodeIdentity.mode=password")
	args := strings.Join(mustObject[appsv1.Deployment](t, objs, "Deployment", "lifeline-controller").Spec.Template.Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--metrics-secure") || !strings.Contains(args, "--metrics-bind-address=:8443") {
		t.Errorf("controller args %s do not serve secure metrics on 8443", args)
	}
	svc := mustObject[corev1.Service](t, objs, "Service", "lifeline-controller-metrics")
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8443 || svc.Spec.Ports[0].TargetPort.StrVal != "metrics" {
		t.Errorf("metrics Service ports %+v", svc.Spec.Ports)
	}
	reader := mustObject[rbacv1.ClusterRole](t, objs, "ClusterRole", "lifeline-metrics-reader")
	if len(reader.Rules) != 1 || strings.Join(reader.Rules[0].NonResourceURLs, ",") != "/metrics" || strings.Join(reader.Rules[0].Verbs, ",") != "get" {
		t.Errorf("lifeline-metrics-reader %+v, want get of /metrics alone", reader.Rules)
	}
	reviews := map[string]bool{}
	for _, r := range mustObject[rbacv1.ClusterRole](t, objs, "ClusterRole", "lifeline-controller").Rules {
		for _, res := range r.Resources {
			if strings.Join(r.Verbs, ",") == "create" {
				reviews[res] = true
			}
		}
	}
	if !reviews["tokenreviews"] || !reviews["subjectaccessreviews"] {
		t.Errorf("the controller cannot ask the API server about scrapers: %v", reviews)
	}
	for _, kind := range []string{"ServiceMonitor", "PrometheusRule"} {
		for _, o := range objs {
			if o.GetKind() == kind {
				t.Errorf("a %s by default: it needs the Prometheus Operator's CRDs", kind)
			}
		}
	}

	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == "lifeline-grafana-dashboard" {
			t.Error("a Grafana dashboard by default")
		}
	}

	with := renderChart(t, "--set", "nodeIdentity.mode=password", "--set", "controller.metrics.serviceMonitor.enabled=true",
		"--set", "controller.metrics.serviceMonitor.labels.release=prom", "--set", "controller.metrics.prometheusRule.enabled=true",
		"--set", "controller.metrics.prometheusRule.cutOffFor=3m", "--set", "controller.metrics.grafanaDashboard.enabled=true")
	dashboard := mustObject[corev1.ConfigMap](t, with, "ConfigMap", "lifeline-grafana-dashboard")
	var board struct {
		Title  string
		Panels []struct {
			Type    string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal([]byte(dashboard.Data["lifeline.json"]), &board); err != nil || board.Title != "Lifeline" {
		t.Errorf("the dashboard does not decode as Lifeline's: %v", err)
	}
	graphs := 0
	for _, p := range board.Panels {
		if p.Type != "row" && len(p.Targets) > 0 && p.Targets[0].Expr != "" {
			graphs++
		}
		// Metrics every controller-runtime program exports (reconciles, work queues, the process) are Lifeline's
		// only under its job.
		for _, target := range p.Targets {
			if !strings.Contains(target.Expr, "lifeline_") && !strings.Contains(target.Expr, `job="lifeline-controller-metrics"`) {
				t.Errorf("dashboard panel %q: %s is not filtered by Lifeline's job", p.Type, target.Expr)
			}
		}
	}
	if graphs < 8 || dashboard.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard with %d graphs and labels %v, want the sidecar's label on at least 8", graphs, dashboard.Labels)
	}
	var monitor, rule *unstructured.Unstructured
	for _, o := range with {
		switch o.GetKind() {
		case "ServiceMonitor":
			monitor = o
		case "PrometheusRule":
			rule = o
		}
	}
	if monitor == nil || rule == nil {
		t.Fatalf("ServiceMonitor %v, PrometheusRule %v", monitor != nil, rule != nil)
	}
	if monitor.GetLabels()["release"] != "prom" {
		t.Errorf("ServiceMonitor labels %v lack the one Prometheus selects by", monitor.GetLabels())
	}
	endpoints, _, _ := unstructured.NestedSlice(monitor.Object, "spec", "endpoints")
	if len(endpoints) != 1 || endpoints[0].(map[string]any)["scheme"] != "https" || endpoints[0].(map[string]any)["bearerTokenFile"] == nil {
		t.Errorf("ServiceMonitor endpoints %v, want https with the scraper's token", endpoints)
	}
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	alerts := map[string]map[string]any{}
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			alerts[r.(map[string]any)["alert"].(string)] = r.(map[string]any)
		}
	}
	for _, name := range []string{"LifelineEdgeNodesCutOff", "LifelineEdgeAgentsSilent", "LifelineWorkersDownOnCutOffNodes",
		"LifelineEdgeJournalBacklog", "LifelineBrokerNearSessionLimit", "LifelineMessagesDropped", "LifelineControllerDown"} {
		if alerts[name] == nil {
			t.Errorf("no alert %s in %v", name, alerts)
		}
	}
	if cut := alerts["LifelineEdgeNodesCutOff"]; cut != nil && cut["for"] != "3m" {
		t.Errorf("LifelineEdgeNodesCutOff for %v, want the value's 3m", cut["for"])
	}
	if _, err := runHelm(t, "template", "lifeline", chartDir, "--set", "nodeIdentity.mode=password",
		"--set", "controller.metrics.prometheusRule.cutOffFor=ten minutes"); err == nil {
		t.Error("a duration Prometheus cannot read was accepted")
	}
}

// With helm template, Argo CD or Flux the chart cannot read its generated CA back, so such users choose an
// existing Secret or cert-manager: then two renders are the same, and nothing is generated. With cert-manager the
// chart asks for the broker's certificate for its names, into the Secret the controller mounts.
func TestBrokerTLSThatGitOpsCanRender(t *testing.T) {
	for name, flags := range map[string][]string{
		"existing Secret": {"--set", "broker.tls.existingSecret=my-broker-tls", "--set", "broker.tls.caCert=MY-CA"},
		"cert-manager":    {"--set", "broker.tls.certManager.issuerRef.name=my-ca", "--set", "broker.tls.caCert=MY-CA"},
	} {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"template", "lifeline", chartDir, "--namespace", namespace, "--set", "nodeIdentity.mode=password",
				"--set", "broker.advertiseAddress={10.0.0.5}"}, flags...)
			first, err := runHelm(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			second, err := runHelm(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(first, second) {
				t.Error("two renders differ: a GitOps sync would change the broker's TLS each time")
			}
			objs := decodeObjects(t, "helm template", first)
			if object[corev1.Secret](t, objs, "Secret", "lifeline-broker-ca-key") != nil {
				t.Error("a CA generated at render time")
			}
			if ca := mustObject[corev1.ConfigMap](t, objs, "ConfigMap", "lifeline-broker-ca"); strings.TrimSpace(ca.Data["ca.crt"]) != "MY-CA" {
				t.Errorf("the agents' CA %q, want the one given", ca.Data["ca.crt"])
			}
			var cert *unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() == "Certificate" {
					cert = o
				}
			}
			if name == "existing Secret" {
				if cert != nil {
					t.Error("a cert-manager Certificate beside an existing Secret")
				}
				return
			}
			if cert == nil {
				t.Fatal("no cert-manager Certificate")
			}
			secret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
			issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
			ips, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "ipAddresses")
			dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
			if secret != "lifeline-broker-tls" || issuer != "my-ca" || !slices.Contains(ips, "10.0.0.5") ||
				!slices.Contains(dns, "lifeline-broker."+namespace+".svc") {
				t.Errorf("Certificate %v", cert.Object["spec"])
			}
		})
	}
}

// [U] GitOps: the same values render the same manifests every time, byte for byte, as helm template, Argo CD and
// Flux render them (no cluster to read back from): nothing is generated at render time by default.
func TestTheSameValuesRenderTheSameManifests(t *testing.T) {
	caFile, _ := testCA(t, "kubeedge")
	for _, values := range [][]string{
		{"--set-file", "nodeIdentity.kubeedgeCA=" + caFile},
		{"--set", "nodeIdentity.mode=password", "--set", "broker.advertiseAddress={192.0.2.10}", "--set", "agent.nodeDaemon=kubelet"},
	} {
		render := func() string {
			out, err := runHelm(t, append([]string{"template", "lifeline", chartDir, "--namespace", namespace}, values...)...)
			if err != nil {
				t.Fatalf("helm template %v: %v", values, err)
			}
			return string(out)
		}
		first, second := render(), render()
		if first != second {
			t.Errorf("%v: two renders differ:\n%s", values, firstDifference(first, second))
		}
	}
}

// firstDifference is the first line where a and b differ, with its number.
func firstDifference(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d: %q, then %q", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("%d lines, then %d", len(al), len(bl))
}
