#!/usr/bin/env bash
# Lifeline on kind with real KubeEdge, on a machine with Docker: a kind cluster as the cloud, KubeEdge's cloudcore
# installed by keadm, one edge node (a privileged container running systemd, containerd and edgecore, joined with
# keadm, its MetaServer enabled), Lifeline's images loaded, the chart installed with nodes logging in with their
# KubeEdge certificates, and an example JointInferenceService with its edge worker on that node.
#
# This script has not been run end to end where it was written (no Docker there); its --dry-run output is checked
# by a test (deploy/kind_test.go). Expect to adapt it. Steps and what each needs are in docs/operations.md.
#
# Usage: deploy/kind/lifeline-on-kind.sh [--dry-run] [--delete]
#   --dry-run  print every command instead of running it
#   --delete   remove the edge node's container and the kind cluster
# Needs docker, kind, kubectl and helm (bin/helm from make tools, or helm on PATH); make images for Lifeline's images.
# Environment: LIFELINE_KIND_CLUSTER (lifeline), LIFELINE_EDGE_NODE (lifeline-edge), KUBEEDGE_VERSION (v1.23.1),
# KIND_NODE_IMAGE (kindest/node:v1.32.2, a Kubernetes that KubeEdge v1.23 supports), LIFELINE_IMAGE_TAG (dev, the
# tag make images gives), LIFELINE_KIND_DIR (work directory: kubeconfig, keadm, KubeEdge's CA; default .kind/).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cluster=${LIFELINE_KIND_CLUSTER:-lifeline}
edge=${LIFELINE_EDGE_NODE:-lifeline-edge}
kubeedge_version=${KUBEEDGE_VERSION:-v1.23.1}
node_image=${KIND_NODE_IMAGE:-kindest/node:v1.32.2}
tag=${LIFELINE_IMAGE_TAG:-dev}
work=${LIFELINE_KIND_DIR:-$root/.kind}
kubeconfig=$work/kubeconfig
chart=$root/deploy/chart/lifeline
namespace=lifeline-system

dry_run=false
delete=false
for arg in "$@"; do
	case $arg in
	--dry-run) dry_run=true ;;
	--delete) delete=true ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "unknown argument $arg (see --help)" >&2
		exit 2
		;;
	esac
done

# Commands are printed on fd 3, the script's standard output, even from inside $(...).
exec 3>&1

# quote prints its arguments as a shell reads them, quoting only those that need it.
quote() {
	local out=() a
	for a in "$@"; do
		if [[ $a =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
			out+=("$a")
		else
			out+=("'${a//\'/\'\\\'\'}'")
		fi
	done
	printf '%s' "${out[*]}"
}

# run prints a command, then runs it unless this is a dry run.
run() {
	printf '+ %s\n' "$(quote "$@")" >&3
	if ! $dry_run; then
		"$@"
	fi
}

# shell prints a pipeline, then runs it with bash unless this is a dry run.
shell() {
	printf '+ %s\n' "$1" >&3
	if ! $dry_run; then
		bash -euo pipefail -c "$1"
	fi
}

# capture prints a command and returns its output, or <name> on a dry run.
capture() {
	local name=$1
	shift
	# shellcheck disable=SC2016 # the $( is printed, not expanded
	printf '+ %s=$(%s)\n' "$name" "$(quote "$@")" >&3
	if $dry_run; then
		echo "<$name>"
	else
		"$@"
	fi
}

# until_ok retries a command every 3 s for up to 5 minutes.
until_ok() {
	printf '+ until %s; do sleep 3; done\n' "$(quote "$@")" >&3
	if $dry_run; then
		return
	fi
	for _ in $(seq 100); do
		if "$@" >/dev/null 2>&1; then
			return
		fi
		sleep 3
	done
	echo "gave up waiting for: $*" >&2
	exit 1
}

kubectl_() { run kubectl --kubeconfig "$kubeconfig" "$@"; }

if $delete; then
	run docker rm -f "$edge"
	run kind delete cluster --name "$cluster"
	exit 0
fi

helm=${HELM:-$root/bin/helm}
if [ ! -x "$helm" ]; then
	helm=helm
fi
if ! $dry_run; then
	for tool in docker kind kubectl "$helm"; do
		command -v "$tool" >/dev/null || {
			echo "$tool is missing" >&2
			exit 1
		}
	done
fi

echo "==> the cloud: a kind cluster"
run mkdir -p "$work"
run kind create cluster --name "$cluster" --image "$node_image" --kubeconfig "$kubeconfig" --wait 120s
cloud_ip=$(capture cloud_ip docker inspect --format '{{ .NetworkSettings.Networks.kind.IPAddress }}' "$cluster-control-plane")
# kind's own DaemonSets would land on the edge node through cloudcore; keep them in the cloud.
off_edge='{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"node-role.kubernetes.io/edge","operator":"DoesNotExist"}]}]}}}}}}}'
for ds in kindnet kube-proxy; do
	kubectl_ -n kube-system patch daemonset "$ds" --type merge --patch "$off_edge"
done

echo "==> KubeEdge's cloudcore, advertised at the control plane's address"
# keadm ships in KubeEdge's installation-package image, as KubeEdge's own end-to-end tests take it.
shell "docker run --rm kubeedge/installation-package:$kubeedge_version cat /usr/local/bin/keadm > $work/keadm && chmod +x $work/keadm"
# The dynamic controller answers the MetaServer's lists and watches, which the agent reads its workers from.
run "$work/keadm" init --advertise-address="$cloud_ip" --kubeedge-version="$kubeedge_version" --kube-config="$kubeconfig" \
	--set cloudCore.modules.dynamicController.enable=true --force
until_ok kubectl --kubeconfig "$kubeconfig" -n kubeedge get secret tokensecret
token=$(capture token "$work/keadm" gettoken --kube-config="$kubeconfig")

echo "==> the edge node: a container with systemd and containerd, joined with keadm"
# kind's node image is a machine with systemd and containerd; kubelet stays off, edgecore takes its place.
run docker run --detach --name "$edge" --hostname "$edge" --network kind --privileged \
	--security-opt seccomp=unconfined --security-opt apparmor=unconfined --cgroupns=private \
	--tmpfs /tmp --tmpfs /run --volume /var --volume /lib/modules:/lib/modules:ro --env container=docker "$node_image"
until_ok docker exec "$edge" systemctl is-active containerd
run docker exec "$edge" systemctl disable --now kubelet
# edged needs a CNI configuration to call the node ready; pods on it get addresses from a local range.
shell "docker exec -i $edge sh -c 'cat > /etc/cni/net.d/10-edge.conflist' <<'CNI'
{\"cniVersion\": \"0.3.1\", \"name\": \"edge\", \"plugins\": [
  {\"type\": \"ptp\", \"ipMasq\": true, \"ipam\": {\"type\": \"host-local\", \"ranges\": [[{\"subnet\": \"10.250.0.0/24\"}]], \"routes\": [{\"dst\": \"0.0.0.0/0\"}]}},
  {\"type\": \"portmap\", \"capabilities\": {\"portMappings\": true}}]}
CNI"
run docker cp "$work/keadm" "$edge:/usr/local/bin/keadm"
# CHECK_EDGECORE_ENVIRONMENT=false: keadm's check for a container environment would refuse this one.
run docker exec --env CHECK_EDGECORE_ENVIRONMENT=false "$edge" keadm join \
	--cloudcore-ipport="$cloud_ip:10000" --token="$token" --edgenode-name="$edge" \
	--kubeedge-version="$kubeedge_version" --remote-runtime-endpoint=unix:///run/containerd/containerd.sock \
	--cgroupdriver=systemd --set modules.metaManager.metaServer.enable=true
until_ok kubectl --kubeconfig "$kubeconfig" get node "$edge"
kubectl_ wait --for=condition=Ready "node/$edge" --timeout=300s

echo "==> KubeEdge's CA, which issued the edge node its certificate"
# The Secret kubeedge/casecret holds the CA's certificate in DER under cadata; its base64 is a PEM body.
shell "{ echo '-----BEGIN CERTIFICATE-----'; kubectl --kubeconfig $kubeconfig -n kubeedge get secret casecret -o jsonpath='{.data.cadata}' | fold -w 64; echo; echo '-----END CERTIFICATE-----'; } | grep -v '^\$' > $work/kubeedge-ca.crt"

echo "==> Lifeline's images, in the cloud and on the edge node"
run make -C "$root" images IMAGE_TAG="$tag"
run kind load image-archive "$root/dist/images/lifeline-controller.tar" --name "$cluster"
run docker cp "$root/dist/images/lifeline-agent.tar" "$edge:/tmp/lifeline-agent.tar"
run docker exec "$edge" ctr --namespace k8s.io images import /tmp/lifeline-agent.tar

echo "==> Lifeline"
run "$helm" upgrade --install lifeline "$chart" --namespace "$namespace" --create-namespace --kubeconfig "$kubeconfig" \
	--set "broker.advertiseAddress={$cloud_ip}" --set-file "nodeIdentity.kubeedgeCA=$work/kubeedge-ca.crt" \
	--set "controller.image.tag=$tag" --set "agent.image.tag=$tag" \
	--set controller.image.pullPolicy=Never --set agent.image.pullPolicy=Never --wait --timeout 5m

echo "==> an example: a JointInferenceService with its edge worker on $edge"
# The example's models are local files, which the workers mount from their nodes.
for node in "$cluster-control-plane" "$edge"; do
	run docker exec "$node" sh -c 'mkdir -p /var/lib/lifeline-example/little /var/lib/lifeline-example/big && touch /var/lib/lifeline-example/little/model.pb /var/lib/lifeline-example/big/model.pb'
done
shell "sed 's/@EDGE@/$edge/' $root/deploy/kind/example.yaml | kubectl --kubeconfig $kubeconfig apply -f -"
kubectl_ wait --for=condition=Ready jointinferenceservice/helmet --timeout=300s

cat <<DONE
==> done. Try:
  export KUBECONFIG=$kubeconfig
  kubectl get ji helmet -o yaml       # status.workers: the edge worker, source apiserver
  # Cut the edge node off from cloudcore (not from the broker), then kill its worker:
  docker exec $edge iptables -I OUTPUT -d $cloud_ip -p tcp -m multiport --dports 10000,10002 -j REJECT
  docker exec $edge sh -c 'crictl stop \$(crictl ps -q --name little-model)'
  kubectl get ji helmet -o yaml       # the worker Dead, source agent; edged restarts it after its back-off
  docker exec $edge iptables -D OUTPUT -d $cloud_ip -p tcp -m multiport --dports 10000,10002 -j REJECT
Remove it all: $0 --delete
DONE
