// Command kube-node is a multi-call binary bundling the node components of
// k8s.io/kubernetes, kubelet and kube-proxy, built from the same wrapper module
// (and so the same pinned version and replace directives) as kube-controlplane.
//
// Usage:
//
//	kube-node kubelet [flags]
//	kube-node kube-proxy [flags]
//
// or through a symlink/hard link named after the component (argv[0]).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go prometheus plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric registration
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var commands = map[string]func() *cobra.Command{
	"kubelet":    func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"kube-proxy": proxy.NewProxyCommand,
}

func usage() {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: %s {%s} [flags]\n", filepath.Base(os.Args[0]), strings.Join(names, "|"))
}

func main() {
	name := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if _, ok := commands[name]; !ok {
		if len(args) == 0 {
			usage()
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	newCommand, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown command %q\n", name)
		usage()
		os.Exit(2)
	}
	// cobra reads os.Args[1:]; make the process look like the upstream binary.
	os.Args = append([]string{name}, args...)
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}
