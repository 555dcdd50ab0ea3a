package realnode

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// clusterDomain is the cluster's DNS domain, as kubeadm names it.
const clusterDomain = "cluster.local"

// serviceDNS answers the pods' questions for Services' ClusterIPs, as the cluster DNS of a kubeadm cluster does for
// <service>.<namespace>[.svc[.cluster.local]]; everything else is NXDOMAIN (the machine has no other network). It
// listens on the API server's address, which every node reaches.
type serviceDNS struct {
	client kubernetes.Interface
	conn   net.PacketConn
}

func startServiceDNS(ctx context.Context, client kubernetes.Interface) (*serviceDNS, error) {
	conn, err := net.ListenPacket("udp4", net.JoinHostPort(apiAddress, "53"))
	if err != nil {
		return nil, fmt.Errorf("cluster DNS: %w", err)
	}
	d := &serviceDNS{client: client, conn: conn}
	go d.serve(ctx)
	return d, nil
}

func (d *serviceDNS) close() { d.conn.Close() }

func (d *serviceDNS) serve(ctx context.Context) {
	buf := make([]byte, 512)
	for {
		n, from, err := d.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if reply := d.answer(ctx, buf[:n]); reply != nil {
			_, _ = d.conn.WriteTo(reply, from)
		}
	}
}

// answer builds the reply to one query, or nil for what is not a query.
func (d *serviceDNS) answer(ctx context.Context, query []byte) []byte {
	var p dnsmessage.Parser
	hdr, err := p.Start(query)
	if err != nil || hdr.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	reply := dnsmessage.Message{Header: dnsmessage.Header{ID: hdr.ID, Response: true, Authoritative: true,
		RecursionDesired: hdr.RecursionDesired}, Questions: []dnsmessage.Question{q}}
	ip, known := d.lookup(ctx, q.Name.String())
	switch {
	case !known:
		reply.Header.RCode = dnsmessage.RCodeNameError
	case q.Type == dnsmessage.TypeA && ip != nil:
		var a [4]byte
		copy(a[:], ip.To4())
		reply.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA,
			Class: dnsmessage.ClassINET, TTL: 5}, Body: &dnsmessage.AResource{A: a}}}
	}
	out, err := reply.Pack()
	if err != nil {
		return nil
	}
	return out
}

// lookup finds the Service a name stands for: known says the name exists (AAAA questions then get no answer
// rather than NXDOMAIN), ip is its ClusterIP.
func (d *serviceDNS) lookup(ctx context.Context, name string) (ip net.IP, known bool) {
	labels := strings.Split(strings.TrimSuffix(strings.ToLower(name), "."), ".")
	switch {
	case len(labels) == 2:
	case len(labels) == 3 && labels[2] == "svc":
	case len(labels) == 5 && labels[2] == "svc" && strings.Join(labels[3:], ".") == clusterDomain:
	default:
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	svc, err := d.client.CoreV1().Services(labels[1]).Get(ctx, labels[0], metav1.GetOptions{})
	if err != nil {
		return nil, false
	}
	return net.ParseIP(svc.Spec.ClusterIP).To4(), true
}
