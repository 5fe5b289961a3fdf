package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/scheme"
)

// The etcd fill (-fill etcd) writes the fill's objects into etcd, in the
// API server's storage form (protobuf behind its "k8s\x00" magic, under
// /registry), as a restore from a backup would: the API server's watch
// cache and every informer then see them as they see any object. It
// exists because kube-apiserver v1.37's ClusterIP allocator recounts every
// IPAddress object twice per Service created (its allocated/available
// metrics: Allocator.Used lists them all), so creating N Services through
// the API costs O(N²): 3,000 took 13 ms of API server CPU per Service,
// 30,000 would take tens of minutes on this machine. Each Service gets the
// fields the API server would have set (a ClusterIP from svcIP, single
// stack IPv4, its defaults), its EndpointSlice, and the IPAddress object
// the allocator would have made, so the API server's IP repair loop finds
// nothing to repair and later allocations skip these addresses. The timed
// Services of (b), (f) and (g) are created through the API as before.

const etcdAddr = "127.0.0.1:2379" // kubecluster's etcd, in the cluster's namespace

// svcIP is fill Service i's ClusterIP: 10.96.10.0 onwards (below it the
// API server's own 10.96.0.1, above it room for the API's allocations).
func svcIP(i int) string {
	base := netip.MustParseAddr("10.96.10.0").As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

// etcdFill writes Services b.created … n-1 with their slices and
// IPAddresses into etcd, 32 Services to a transaction, and returns the
// last Service as read back through the API.
func (b *bench) etcdFill(ctx context.Context, n int) (*corev1.Service, error) {
	if n-1 >= 50000 {
		return nil, fmt.Errorf("-fill etcd: at most 50,000 Services (svcIP's range)")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdAddr}, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return b.c.DialContext(ctx, "tcp", addr)
		})}})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ser := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	enc := func(o runtime.Object) (string, error) {
		var buf bytes.Buffer
		if err := ser.Encode(o, &buf); err != nil {
			return "", err
		}
		return buf.String(), nil
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	ops := func(i int) ([]clientv3.Op, error) {
		name, ip := "s-"+strconv.Itoa(i), svcIP(i)
		single, cluster := corev1.IPFamilyPolicySingleStack, corev1.ServiceInternalTrafficPolicyCluster
		svc := &corev1.Service{TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: now},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
				IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: &single,
				SessionAffinity: corev1.ServiceAffinityNone, InternalTrafficPolicy: &cluster,
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}}}
		sl := slice(name, i, 0)
		sl.TypeMeta = metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"}
		sl.Namespace, sl.UID, sl.CreationTimestamp, sl.Generation = ns, uuid.NewUUID(), now, 1
		ipa := &networkingv1.IPAddress{TypeMeta: metav1.TypeMeta{Kind: "IPAddress", APIVersion: "networking.k8s.io/v1"},
			ObjectMeta: metav1.ObjectMeta{Name: ip, UID: uuid.NewUUID(), CreationTimestamp: now, Labels: map[string]string{
				networkingv1.LabelIPAddressFamily: string(corev1.IPv4Protocol), networkingv1.LabelManagedBy: "ipallocator.k8s.io"}},
			Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{Resource: "services", Namespace: ns, Name: name}}}
		var out []clientv3.Op
		for _, kv := range []struct {
			key string
			obj runtime.Object
		}{
			{"/registry/endpointslices/" + ns + "/" + sl.Name, sl},
			{"/registry/ipaddresses/" + ip, ipa},
			{"/registry/services/specs/" + ns + "/" + name, svc},
		} {
			v, err := enc(kv.obj)
			if err != nil {
				return nil, err
			}
			out = append(out, clientv3.OpPut(kv.key, v))
		}
		return out, nil
	}
	b.growVIPs(n)
	const perTxn = 32 // 96 operations: under etcd's default --max-txn-ops of 128
	var (
		mu       sync.Mutex
		next     = b.created
		firstErr error
		wg       sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for {
				mu.Lock()
				from := next
				next += perTxn
				stop := firstErr != nil
				mu.Unlock()
				if stop || from >= n {
					return
				}
				var batch []clientv3.Op
				var err error
				for i := from; i < min(from+perTxn, n) && err == nil; i++ {
					var o []clientv3.Op
					o, err = ops(i)
					batch = append(batch, o...)
					b.vips[i] = svcIP(i)
				}
				if err == nil {
					_, err = cli.Txn(ctx).Then(batch...).Commit()
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("etcd fill: %w", err)
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	b.created = n
	// Read back through the API (its watch cache has caught up once the
	// last one is there).
	var last *corev1.Service
	err = wait(2*time.Minute, "API server sees the etcd fill", func() error {
		s, err := b.k.CoreV1().Services(ns).Get(ctx, "s-"+strconv.Itoa(n-1), metav1.GetOptions{ResourceVersion: "0"})
		last = s
		return err
	})
	return last, err
}
