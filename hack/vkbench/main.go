// Command vkbench runs a virtual-kubelet node (the Go library, node/nodeutil) with a trivial
// in-memory provider, as the baseline of the load benchmark in host/node/benches/load.rs.
//
// The provider keeps Pods in a map: CreatePod marks a Pod Running at once, DeletePod removes it
// and pushes a terminal status, and status is pushed through NotifyPods rather than polled. It
// serves no kubelet HTTP API (no TLS config is given, so the library starts none).
//
// It is a benchmark fixture, not a provider to deploy.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	stdlog "log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	vkslog "github.com/virtual-kubelet/virtual-kubelet/log/slog"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

type options struct {
	kubeconfig string
	nodeName   string
	workers    int
	qps        float64
	burst      int
	maxPods    int
	logLevel   string
	queueQPS   float64
}

func main() {
	var o options
	flag.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "path to the kubeconfig")
	flag.StringVar(&o.nodeName, "node-name", "vkbench", "name of the Node to register")
	flag.IntVar(&o.workers, "workers", 10, "pod sync workers (virtual-kubelet's CLI default is 10)")
	flag.Float64Var(&o.qps, "qps", 0, "client QPS to the API server; 0 keeps client-go's default (5)")
	flag.IntVar(&o.burst, "burst", 0, "client burst; 0 keeps client-go's default (10)")
	flag.IntVar(&o.maxPods, "max-pods", 2000, "pods and nvidia.com/gpu the node advertises")
	flag.Float64Var(&o.queueQPS, "queue-qps", 0,
		"overall rate of each pod-controller work queue; 0 keeps the library's default (10/s, burst 100)")
	flag.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	flag.Parse()

	var level stdlog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "vkbench: --log-level: %v\n", err)
		os.Exit(2)
	}
	logger := stdlog.New(stdlog.NewTextHandler(os.Stderr, &stdlog.HandlerOptions{Level: level}))
	vklog.L = vkslog.FromSlog(logger)

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, o); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "vkbench: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if o.kubeconfig == "" {
		return errors.New("--kubeconfig (or KUBECONFIG) is required")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("failed to read kubeconfig %s: %w", o.kubeconfig, err)
	}
	cfg.QPS = float32(o.qps)
	cfg.Burst = o.burst
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("failed to build a client: %w", err)
	}
	n, err := nodeutil.NewNode(o.nodeName, newProvider(o.maxPods),
		nodeutil.WithClient(client),
		func(c *nodeutil.NodeConfig) error {
			c.NumWorkers = o.workers
			c.NodeSpec.Spec.Taints = []corev1.Taint{{
				Key:    "virtual-kubelet.io/provider",
				Value:  "mock",
				Effect: corev1.TaintEffectNoSchedule,
			}}
			return nil
		},
		nodeutil.WithPodControllerConfigOverrides(func(c *node.PodControllerConfig) error {
			if o.queueQPS > 0 {
				c.SyncPodsFromKubernetesRateLimiter = queueLimiter(o.queueQPS)
				c.DeletePodsFromKubernetesRateLimiter = queueLimiter(o.queueQPS)
				c.SyncPodStatusFromProviderRateLimiter = queueLimiter(o.queueQPS)
			}
			return nil
		}))
	if err != nil {
		return fmt.Errorf("failed to create node %s: %w", o.nodeName, err)
	}
	go func() {
		if err := n.WaitReady(ctx, 2*time.Minute); err != nil {
			fmt.Fprintf(os.Stderr, "vkbench: node %s not ready: %v\n", o.nodeName, err)
			return
		}
		fmt.Fprintf(os.Stderr, "vkbench: node %s ready\n", o.nodeName)
	}()
	return n.Run(ctx)
}

// queueLimiter is client-go's default controller limiter (per-item exponential backoff, and an
// overall token bucket) with the overall rate raised to qps and the burst to ten times that.
func queueLimiter(qps float64) workqueue.TypedRateLimiter[any] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[any](5*time.Millisecond, 1000*time.Second),
		&workqueue.TypedBucketRateLimiter[any]{Limiter: rate.NewLimiter(rate.Limit(qps), int(qps)*10)},
	)
}

// newProvider returns the nodeutil provider constructor; it also fills the Node's capacity.
func newProvider(maxPods int) nodeutil.NewProviderFunc {
	return func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		q := resource.MustParse(fmt.Sprint(maxPods))
		list := corev1.ResourceList{
			corev1.ResourcePods:   q,
			"nvidia.com/gpu":      q,
			corev1.ResourceCPU:    resource.MustParse("1000"),
			corev1.ResourceMemory: resource.MustParse("4Ti"),
		}
		pc.Node.Status.Capacity = list
		pc.Node.Status.Allocatable = list.DeepCopy()
		return &memProvider{pods: map[string]*corev1.Pod{}, notify: func(*corev1.Pod) {}}, nil, nil
	}
}
