// Command kube-controlplane is a multi-call binary bundling kube-apiserver,
// kube-controller-manager and kube-scheduler from k8s.io/kubernetes, so the
// control plane is linked once instead of three times.
//
// Usage:
//
//	kube-controlplane kube-apiserver [flags]
//	kube-controlplane kube-controller-manager [flags]
//	kube-controlplane kube-scheduler [flags]
//
// or through a symlink/hard link named after the component (argv[0]).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	_ "time/tzdata" // for CronJob time zone support, as upstream's mains

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go prometheus plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric registration
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var commands = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
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
