// Command coredns is CoreDNS with the plugins the real node's Corefile uses
// (hack/templates/Corefile) and no others: upstream's main links every plugin, with the
// cloud providers' SDKs (route53, azure, clouddns) that the real node never uses. A main
// package of the control plane's module, so it shares its client-go and gRPC with the
// control plane and Go's build cache compiles them once.
package main

import (
	_ "github.com/coredns/caddy/onevent"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
