// Command celgo runs the CEL benchmark expressions of host/policy/benches/cel.rs with cel-go,
// over the same 1,000 generated offers, and prints ns per 1,000-offer batch and per evaluation.
//
//	cd hack/bench/celgo && go run .
//
// Two input shapes: "map" binds offer and workload as map(string, dyn) (the common way), and
// "native" binds Go structs through ext.NativeTypes (typed fields, checked at compile time).
package main

import (
	"fmt"
	"os"
	"reflect"
	"testing"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"
)

// The expressions of host/policy/tests/cel_support/mod.rs (BENCH_CONSTRAINT and BENCH_RANK).
const (
	constraintSrc = `offer.price_per_hour <= 2.0 && offer.gpu.memory_gib >= 40 && offer.region.startsWith("us-")`
	rankSrc       = `offer.reliability * 100.0 - offer.price_per_hour * 10.0 + double(offer.gpu.memory_gib) / 8.0`
	numOffers     = 1000
)

// Gpu and Offer mirror CelGpu and CelOffer for the native-types variant.
type Gpu struct {
	Model     string `cel:"model"`
	MemoryGib int64  `cel:"memory_gib"`
}

type Offer struct {
	Provider     string  `cel:"provider"`
	ID           string  `cel:"id"`
	Gpu          Gpu     `cel:"gpu"`
	GpuCount     int64   `cel:"gpu_count"`
	PricePerHour float64 `cel:"price_per_hour"`
	Spot         bool    `cel:"spot"`
	Region       string  `cel:"region"`
	Reliability  float64 `cel:"reliability"`
	Verified     bool    `cel:"verified"`
	DiskGib      int64   `cel:"disk_gib"`
}

var (
	providers = []string{"runpod", "lambda", "vast", "kube"}
	models    = []string{"H100", "A100-80GB", "L40S", "RTX-4090", "A10"}
	memories  = []int64{80, 80, 48, 24, 24}
	regions   = []string{"us-east-1", "us-west-2", "eu-central-1", "ap-south-1"}
)

// offer is offer(i) of host/policy/tests/cel_support/mod.rs.
func offer(i int) Offer {
	return Offer{
		Provider:     providers[i%4],
		ID:           fmt.Sprintf("offer-%d", i),
		Gpu:          Gpu{Model: models[i%5], MemoryGib: memories[i%5]},
		GpuCount:     1 + int64(i%8),
		PricePerHour: 0.2 + float64((i*37)%400)/100.0,
		Spot:         i%3 == 0,
		Region:       regions[(i/4)%4],
		Reliability:  0.8 + float64((i*13)%20)/100.0,
		Verified:     i%2 == 0,
		DiskGib:      50 + int64(i%10)*10,
	}
}

func (o Offer) asMap() map[string]any {
	return map[string]any{
		"provider": o.Provider, "id": o.ID,
		"gpu":       map[string]any{"model": o.Gpu.Model, "memory_gib": o.Gpu.MemoryGib},
		"gpu_count": o.GpuCount, "price_per_hour": o.PricePerHour, "spot": o.Spot,
		"region": o.Region, "reliability": o.Reliability, "verified": o.Verified,
		"disk_gib": o.DiskGib,
	}
}

func workload() map[string]any {
	return map[string]any{
		"gpu_count": int64(1), "gpu_models": []string{"H100", "A100-80GB"}, "max_price": 3.5,
		"capacity_type": "any", "regions": []string{"us-east-1", "us-west-2"},
		"image":       "ghcr.io/acme/train:1.2",
		"annotations": map[string]string{"cloud.aibrix.ai/tier": "gold", "team": "ml"},
	}
}

func attempts() []map[string]any {
	return []map[string]any{
		{"provider": "vast", "offer_id": "offer-7", "failure_class": "capacity", "message": "no longer available"},
		{"provider": "runpod", "offer_id": "offer-9", "failure_class": "rate-limited", "message": "slow down"},
	}
}

func newEnv(native bool) (*cel.Env, error) {
	dyn := cel.MapType(cel.StringType, cel.DynType)
	opts := []cel.EnvOption{
		cel.Variable("workload", dyn),
		cel.Variable("attempts", cel.ListType(dyn)),
	}
	if native {
		opts = append(opts,
			ext.NativeTypes(ext.ParseStructTags(true), reflect.TypeFor[Offer](), reflect.TypeFor[Gpu]()),
			cel.Variable("offer", cel.ObjectType("main.Offer")))
	} else {
		opts = append(opts, cel.Variable("offer", dyn))
	}
	return cel.NewEnv(opts...)
}

func compile(env *cel.Env, src string) (cel.Program, error) {
	ast, iss := env.Compile(src)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	return env.Program(ast, cel.EvalOptions(cel.OptOptimize))
}

func activations(native bool) ([]interpreter.Activation, error) {
	out := make([]interpreter.Activation, numOffers)
	for i := range out {
		var o any = offer(i).asMap()
		if native {
			o = offer(i)
		}
		act, err := interpreter.NewActivation(map[string]any{
			"workload": workload(), "attempts": attempts(), "offer": o,
		})
		if err != nil {
			return nil, err
		}
		out[i] = act
	}
	return out, nil
}

// batch evaluates prg over every activation, as the Rust batch does; it returns how many
// offers a constraint keeps, or the sum of a rank's scores.
func batch(prg cel.Program, acts []interpreter.Activation) (float64, error) {
	total := 0.0
	for _, act := range acts {
		out, _, err := prg.Eval(act)
		if err != nil {
			return 0, err
		}
		switch v := out.Value().(type) {
		case bool:
			if v {
				total++
			}
		case float64:
			total += v
		}
	}
	return total, nil
}

func report(name string, r testing.BenchmarkResult, perBatch int) {
	ns := float64(r.T.Nanoseconds()) / float64(r.N)
	fmt.Printf("%-34s %12.0f ns/op %10.1f ns/eval (%d iterations)\n", name, ns, ns/float64(perBatch), r.N)
}

func run(native bool) error {
	shape := map[bool]string{false: "map", true: "native"}[native]
	env, err := newEnv(native)
	if err != nil {
		return err
	}
	acts, err := activations(native)
	if err != nil {
		return err
	}
	for _, e := range []struct{ name, src string }{{"constraint", constraintSrc}, {"rank", rankSrc}} {
		prg, err := compile(env, e.src)
		if err != nil {
			return fmt.Errorf("compile %s: %w", e.name, err)
		}
		total, err := batch(prg, acts)
		if err != nil {
			return fmt.Errorf("eval %s: %w", e.name, err)
		}
		fmt.Printf("%s: %s over %d offers: total %.6f (kept offers, or sum of scores)\n",
			shape, e.name, numOffers, total)
		r := testing.Benchmark(func(b *testing.B) {
			for b.Loop() {
				if _, err := batch(prg, acts); err != nil {
					b.Fatal(err)
				}
			}
		})
		report(fmt.Sprintf("cel-go/%s/%s_1000_offers", shape, e.name), r, numOffers)
		r = testing.Benchmark(func(b *testing.B) {
			for b.Loop() {
				if _, err := compile(env, e.src); err != nil {
					b.Fatal(err)
				}
			}
		})
		report(fmt.Sprintf("cel-go/%s/%s_compile", shape, e.name), r, 1)
	}
	return nil
}

func main() {
	start := time.Now()
	for _, native := range []bool{false, true} {
		if err := run(native); err != nil {
			fmt.Fprintln(os.Stderr, "celgo:", err)
			os.Exit(1)
		}
	}
	fmt.Printf("total %s\n", time.Since(start).Round(time.Millisecond))
}
