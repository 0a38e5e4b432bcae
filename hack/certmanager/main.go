// Command cert-manager-controller runs a subset of cert-manager's controllers
// (github.com/cert-manager/cert-manager/pkg/controller/...) as a plain process
// against a kubeconfig: Issuer/ClusterIssuer and CertificateRequest signing for
// the CA and SelfSigned issuer types, the CertificateRequest approver and the six
// Certificate controllers. No leader election, metrics, healthz or webhook.
//
// Usage:
//
//	cert-manager-controller --kubeconfig=FILE [--namespace=NS] [--cluster-resource-namespace=NS]
//	    [--workers=5] [--feature-gates=K=V,...] [--v=N]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/cert-manager/cert-manager/pkg/controller"
	crapprover "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"         // registers the CA issuer type
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned" // registers the SelfSigned issuer type
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	utilfeature "github.com/cert-manager/cert-manager/pkg/util/feature"
)

// The controllers this wrapper runs (each package registers itself in controller.Known()).
var enabled = []string{
	issuers.ControllerName, clusterissuers.ControllerName,
	crapprover.ControllerName, crca.CRControllerName, crselfsigned.CRControllerName,
	trigger.ControllerName, issuing.ControllerName, keymanager.ControllerName,
	requestmanager.ControllerName, readiness.ControllerName, revisionmanager.ControllerName,
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cert-manager-controller:", err)
		os.Exit(1)
	}
}

func run() error {
	var opts controller.ContextOptions
	flag.StringVar(&opts.Kubeconfig, "kubeconfig", "", "kubeconfig file (empty: in-cluster config)")
	flag.StringVar(&opts.APIServerHost, "master", "", "API server address, overrides the kubeconfig's")
	flag.StringVar(&opts.Namespace, "namespace", "", "only watch this namespace (empty: all; disables ClusterIssuers)")
	flag.StringVar(&opts.ClusterResourceNamespace, "cluster-resource-namespace", "kube-system", "namespace of ClusterIssuer secrets (e.g. a CA's key pair)")
	flag.BoolVar(&opts.EnableOwnerRef, "enable-certificate-owner-ref", false, "make Certificates owners of their Secrets")
	workers := flag.Int("workers", 5, "workers per controller")
	flag.Func("feature-gates", "cert-manager feature gates, K=V,...", utilfeature.DefaultMutableFeatureGate.Set)
	klog.InitFlags(nil) // --v, --logtostderr, ...
	flag.Parse()
	// Upstream defaults (internal/apis/config/controller/v1alpha1/defaults.go).
	opts.KubernetesAPIQPS, opts.KubernetesAPIBurst = 20, 50
	opts.ClusterIssuerAmbientCredentials = true
	opts.CertificateRequestMinimumBackoffDuration = time.Hour
	opts.CertificateRequestMaximumBackoffDuration = 32 * time.Hour

	logf.InitLogs()
	defer logf.FlushLogs()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "controller")
	log := logf.FromContext(ctx)

	factory, err := controller.NewContextFactory(ctx, opts)
	if err != nil {
		return err
	}
	base, err := factory.Build() // shares the informer factories with every controller's context
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, name := range enabled {
		if opts.Namespace != "" && name == clusterissuers.ControllerName {
			continue // cluster-scoped: upstream skips it when namespaced too
		}
		ctor, ok := controller.Known()[name]
		if !ok {
			return fmt.Errorf("controller %q is not registered", name)
		}
		c, err := ctor(factory)
		if err != nil {
			return fmt.Errorf("building controller %q: %w", name, err)
		}
		log.Info("starting controller", "controller", name)
		g.Go(func() error { return c.Run(*workers, gctx) })
	}
	// Informers are requested by the constructors above, so start the factories after them.
	base.SharedInformerFactory.Start(gctx.Done())
	base.KubeSharedInformerFactory.Start(gctx.Done())
	base.HTTP01ResourceMetadataInformersFactory.Start(gctx.Done())
	err = g.Wait()
	if ctx.Err() != nil {
		err = nil // stopped by a signal: controllers that were still syncing caches report that as an error
	}
	base.HTTP01ResourceMetadataInformersFactory.Shutdown()
	base.KubeSharedInformerFactory.Shutdown()
	base.SharedInformerFactory.Shutdown()
	return err
}
