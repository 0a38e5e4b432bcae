// Command kube-network-policies runs the NetworkPolicy engine of
// sigs.k8s.io/kube-network-policies (pkg/networkpolicy) on the real node of
// hack/cluster.sh (REAL_NODE=1), as a host process with a kubeconfig rather than a
// DaemonSet with in-cluster credentials.
//
// The engine is a userspace verdict loop: the kernel queues the first packet of each
// new connection to an NFQUEUE and the engine accepts or drops it from the
// NetworkPolicies, namespaces and pods it watches. Upstream also installs nftables
// rules that do the queueing (the nftables "queue" statement); this wrapper keeps those
// inert by default (--nftables-rules=false) because hack/real-node.sh queues with the
// iptables NFQUEUE target instead: some kernels lack CONFIG_NFT_QUEUE, and its rules
// would also police the host's own (non-root) connections to pods.
//
// Usage:
//
//	kube-network-policies --kubeconfig=FILE --hostname-override=NODE [--nfqueue-id=100]
//	    [--fail-open=true] [--metrics-bind-address=127.0.0.1:PORT] [--v=N]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() { os.Exit(run()) }

func run() int {
	var (
		kubeconfig       = flag.String("kubeconfig", "", "kubeconfig of the engine's identity (required)")
		hostnameOverride = flag.String("hostname-override", "", "name of the Node the engine runs on (required)")
		queueID          = flag.Int("nfqueue-id", 100, "NFQUEUE number the kernel queues new connections to")
		failOpen         = flag.Bool("fail-open", true, "accept packets the engine cannot judge (queue full, unparsable) instead of dropping them")
		metricsAddr      = flag.String("metrics-bind-address", "", "host:port for /metrics (empty: none)")
		nftablesRules    = flag.Bool("nftables-rules", false, "let the engine install its own nftables queue rules for this node's pods (needs CONFIG_NFT_QUEUE)")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *hostnameOverride == "" {
		fmt.Fprintln(os.Stderr, "--kubeconfig and --hostname-override are required")
		return 2
	}
	if *metricsAddr != "" {
		if _, _, err := net.SplitHostPort(*metricsAddr); err != nil {
			fmt.Fprintf(os.Stderr, "--metrics-bind-address: %v\n", err)
			return 2
		}
	}

	// SIGTERM too (cluster.sh down sends it): Run's deferred cleanup must run.
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	logger := klog.FromContext(ctx)

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		logger.Error(err, "loading kubeconfig", "path", *kubeconfig)
		return 1
	}
	// As upstream's main: protobuf for the core types it watches.
	config.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	config.ContentType = "application/vnd.kubernetes.protobuf"
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		logger.Error(err, "creating clientset")
		return 1
	}

	// The engine uses NodeName only to pick the local pods whose IPs its nftables rules
	// divert to the queue (and to resync those rules on their changes); verdicts do not
	// depend on it. A name no Node can have (a "/" is not allowed) leaves those rules
	// without addresses and the resyncs never triggered: no queueing, no error spam where
	// the nftables queue statement is missing. The rules are still written once at start
	// (a failed transaction there is logged, not fatal) and removed at exit.
	nodeName := *hostnameOverride
	if !*nftablesRules {
		nodeName += "/iptables-queue"
	}
	// NRI stays enabled on purpose: with NRIdisabled the engine keeps a nil NRI plugin
	// and dereferences it for any queued packet whose address is not (yet) a known pod
	// IP, which crashes it. The real node's containerd (1.6) has no NRI: the plugin gets an
	// unusable connection through the environment (rather than dialling
	// /var/run/nri/nri.sock, which another runtime on the host may serve), fails to start
	// and stays empty.
	if err := os.Setenv("NRI_PLUGIN_SOCKET", "none"); err != nil {
		logger.Error(err, "setting NRI_PLUGIN_SOCKET")
		return 1
	}
	cfg := networkpolicy.Config{
		FailOpen:            *failOpen,
		QueueID:             *queueID,
		NodeName:            nodeName,
		NetfilterBug1766Fix: false, // only shapes the nftables rules (DNS on prerouting)
		NRIdisabled:         false,
	}

	factory := informers.NewSharedInformerFactory(clientset, 0)
	controller, err := networkpolicy.NewController(
		clientset,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, // nodes: only for admin network policies, off
		nil, nil, nil,
		cfg,
	)
	if err != nil {
		logger.Error(err, "creating the network policy controller")
		return 1
	}

	if *metricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.Handler())
		server := &http.Server{Addr: *metricsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := server.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error(err, "metrics server")
				cancel()
			}
		}()
		defer server.Close() //nolint:errcheck
	}

	done := make(chan error, 1)
	go func() { done <- controller.Run(ctx) }()
	factory.Start(ctx.Done())
	logger.Info("started", "node", *hostnameOverride, "queue", *queueID, "failOpen", *failOpen, "nftablesRules", *nftablesRules)

	select {
	case err = <-done: // Run returns early only when it cannot open the queue
		logger.Error(err, "network policy controller stopped")
		return 1
	case <-ctx.Done():
	}
	select { // let Run close the queue and remove its nftables table
	case <-done:
	case <-time.After(5 * time.Second):
	}
	factory.Shutdown()
	return 0
}
