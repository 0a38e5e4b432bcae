// A controller-runtime Memcached operator for comparison in `make bench`: the operator-sdk Go
// tutorial's controller (controller.go) behind the kubebuilder go/v4 scaffold's manager, with its
// defaults: one worker, leader election that does not release on shutdown, readiness by ping.
// Three flags are added so the harness can drive it like our operator: --identity (the Lease
// holder name), --leader-election-namespace and --max-concurrent-reconciles; and --with-service,
// a headless Service per Memcached as ours has (off by default, as in the tutorial).
package main

import (
	"flag"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

const leaseName = "memcached-operator-lock"

func main() {
	var metricsAddr, probeAddr, identity, leaseNamespace string
	var leaderElect, secureMetrics, withService bool
	var workers int
	flag.StringVar(&metricsAddr, "metrics-bind-address", "0", "The address the metrics endpoint binds to; 0 disables it.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "The address the probe endpoint binds to.")
	flag.BoolVar(&leaderElect, "leader-elect", false, "Enable leader election for controller manager.")
	flag.BoolVar(&secureMetrics, "metrics-secure", true, "Serve metrics over HTTPS with authn/authz.")
	flag.StringVar(&leaseNamespace, "leader-election-namespace", "", "Namespace of the leader election Lease (default: the in-cluster namespace).")
	flag.StringVar(&identity, "identity", "", "Lease holder identity (default: host name plus a UUID).")
	flag.BoolVar(&withService, "with-service", false, "Also create a headless Service per Memcached.")
	flag.IntVar(&workers, "max-concurrent-reconciles", 1, "Concurrent reconciles.")
	opts := zap.Options{Development: true}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(addToScheme(scheme))

	config := ctrl.GetConfigOrDie()
	options := ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr, SecureServing: secureMetrics},
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        leaseName,
		LeaderElectionNamespace: leaseNamespace,
	}
	if leaderElect && identity != "" {
		lock, err := resourcelock.NewFromKubeconfig(resourcelock.LeasesResourceLock, leaseNamespace, leaseName,
			resourcelock.ResourceLockConfig{Identity: identity}, config, 10*time.Second)
		if err != nil {
			log.Error(err, "unable to create the leader election lock")
			os.Exit(1)
		}
		options.LeaderElectionResourceLockInterface = lock
	}
	mgr, err := ctrl.NewManager(config, options)
	if err != nil {
		log.Error(err, "unable to start manager")
		os.Exit(1)
	}
	r := &reconciler{Client: mgr.GetClient(), scheme: mgr.GetScheme(), recorder: mgr.GetEventRecorderFor("memcached-controller"), withService: withService}
	if err := r.setup(mgr, workers); err != nil {
		log.Error(err, "unable to create controller")
		os.Exit(1)
	}
	utilruntime.Must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	utilruntime.Must(mgr.AddReadyzCheck("readyz", healthz.Ping))
	log.Info("starting manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "problem running manager")
		os.Exit(1)
	}
}
