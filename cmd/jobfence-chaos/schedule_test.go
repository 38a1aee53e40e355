package main

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func testParams(kinds map[faultKind]bool) planParams {
	return planParams{Window: time.Minute, Workers: 4, Replicas: 2, Lease: 4 * time.Second, Kinds: kinds}
}

func TestPlanIsReplayableFromItsSeed(t *testing.T) {
	all, err := parseFaultKinds("all")
	if err != nil {
		t.Fatal(err)
	}
	a, b := plan(42, testParams(all)), plan(42, testParams(all))
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two plans")
	}
	if len(a) < 20 {
		t.Fatalf("a one-minute plan has %d faults, want a campaign's worth", len(a))
	}
	if reflect.DeepEqual(a, plan(43, testParams(all))) {
		t.Fatal("seeds 42 and 43 gave the same plan")
	}
	for i, f := range a {
		if f.N != i+1 || f.At < 0 || f.At >= time.Minute || f.For <= 0 {
			t.Errorf("fault %+v: bad number, start or duration", f)
		}
		if i > 0 && f.At < a[i-1].At {
			t.Errorf("fault %d starts before fault %d", f.N, a[i-1].N)
		}
	}
}

func TestPlanLanesNeverOverlap(t *testing.T) {
	all, _ := parseFaultKinds("all")
	end := map[string]time.Duration{}
	for _, f := range plan(7, testParams(all)) {
		if f.At < end[f.Target] {
			t.Errorf("fault %d on %s starts at %s, before the previous one ends at %s", f.N, f.Target, f.At, end[f.Target])
		}
		end[f.Target] = f.At + f.For
	}
}

func TestPlanKeepsToTheChosenKinds(t *testing.T) {
	kinds, err := parseFaultKinds("worker-kill,db")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[faultKind]bool{}
	for _, f := range plan(1, testParams(kinds)) {
		if !kinds[f.Kind] {
			t.Errorf("fault %d is a %s, not chosen", f.N, f.Kind)
		}
		seen[f.Kind] = true
	}
	if !seen[faultWorkerKill] || !seen[faultDBCommitCut] {
		t.Errorf("chosen kinds missing from a one-minute plan: %v", seen)
	}
	if _, err := parseFaultKinds("worker,nonsense"); err == nil {
		t.Error("an unknown kind was accepted")
	}
}

// A lane's plan does not change when targets are added: a seed replays the
// same faults on worker-1 with four workers or with five.
func TestPlanLaneIndependentOfOtherLanes(t *testing.T) {
	all, _ := parseFaultKinds("all")
	p4 := testParams(all)
	p5 := p4
	p5.Workers = 5
	only := func(fs []fault, target string) []fault {
		var out []fault
		for _, f := range fs {
			if f.Target == target {
				f.N = 0
				out = append(out, f)
			}
		}
		return out
	}
	for _, target := range []string{"worker-1", "replica-a", "replica-b-db", "provider"} {
		if !reflect.DeepEqual(only(plan(9, p4), target), only(plan(9, p5), target)) {
			t.Errorf("%s's faults changed when a fifth worker was added", target)
		}
	}
}

func TestFaultRateMakesFaultsDenser(t *testing.T) {
	all, _ := parseFaultKinds("all")
	p := testParams(all)
	base := len(plan(3, p))
	p.Rate = 3
	if dense := len(plan(3, p)); dense <= base {
		t.Errorf("--fault-rate 3 gave %d faults, rate 1 gave %d", dense, base)
	}
}

// --failover adds one db-failover at 35–50 % of the window, on a lane of
// its own: the other lanes' faults do not move.
func TestPlanFailoverIsOneFaultOnItsOwnLane(t *testing.T) {
	all, _ := parseFaultKinds("all")
	p := testParams(all)
	without := plan(5, p)
	p.Failover = failoverAsync
	with := plan(5, p)
	var fos []fault
	var rest []fault
	for _, f := range with {
		if f.Kind == faultDBFailover {
			fos = append(fos, f)
			continue
		}
		f.N = 0
		rest = append(rest, f)
	}
	if len(fos) != 1 {
		t.Fatalf("%d db-failover faults, want 1", len(fos))
	}
	fo := fos[0]
	if fo.At < p.Window*35/100 || fo.At > p.Window/2 || fo.Mode != failoverAsync || fo.Target != failoverTarget ||
		fo.For != 2*p.Lease || fo.Pause <= 0 || fo.Delay <= 0 || fo.Hold <= 0 {
		t.Errorf("db-failover %+v", fo)
	}
	for i := range without {
		without[i].N = 0
	}
	if !reflect.DeepEqual(rest, without) {
		t.Error("the failover moved other faults")
	}
	if p.Kinds[faultDBFailover] {
		t.Error("--faults all names db-failover; only --failover plans it")
	}
}

func TestFailoverFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--failover", "async"}, true},
		{[]string{"--failover", "semi-sync", "--mysql-dsn", "root@tcp(127.0.0.1:3306)/"}, true},
		{[]string{"--failover", "sync"}, false},
	} {
		var out strings.Builder
		c2, err := parseFlags(c.args, &out)
		if (err == nil) != c.ok {
			t.Errorf("%v: err %v", c.args, err)
		}
		if err != nil && len(c.args) > 1 && c.args[1] == "sync" && !strings.Contains(err.Error(), "--failover") {
			t.Errorf("the error does not name the flag: %v", err)
		}
		if err == nil && c2.dsn != nil {
			t.Errorf("%v: with --failover the DSN is the campaign's own pair's, not --mysql-dsn", c.args)
		}
	}
}

// --webhooks adds the webhook lane and moves no other lane's faults; "all"
// and the webhook group leave webhook-drop out, naming it brings it in.
func TestPlanWebhookLane(t *testing.T) {
	all, _ := parseFaultKinds("all")
	if all[faultWebhookDrop] || !all[faultWebhookDuplicate] {
		t.Fatalf("--faults all: webhook-drop %v, webhook-duplicate %v", all[faultWebhookDrop], all[faultWebhookDuplicate])
	}
	p := testParams(all)
	without := plan(11, p)
	p.Webhooks = true
	with := plan(11, p)
	var rest []fault
	kinds := map[faultKind]int{}
	for _, f := range with {
		if f.Target == webhookTarget {
			kinds[f.Kind]++
			if f.webhookModes().IsZero() || (f.Kind == faultWebhookDelay && f.Amount <= 0) {
				t.Errorf("fault %d (%s) sets no webhook mode: %+v", f.N, f, f.webhookModes())
			}
			continue
		}
		f.N = 0
		rest = append(rest, f)
	}
	for i := range without {
		without[i].N = 0
	}
	if !reflect.DeepEqual(rest, without) {
		t.Error("the webhook lane moved other faults")
	}
	for _, k := range faultGroups["webhook"] {
		if kinds[k] == 0 {
			t.Errorf("a one-minute plan has no %s: %v", k, kinds)
		}
	}
	if kinds[faultWebhookDrop] > 0 {
		t.Errorf("webhook-drop drawn without being named: %v", kinds)
	}
	if !reflect.DeepEqual(with, plan(11, p)) {
		t.Error("the same seed gave two plans with webhooks")
	}

	named, err := parseFaultKinds("webhook-drop,all")
	if err != nil || !named[faultWebhookDrop] || !named[faultWorkerKill] {
		t.Fatalf("--faults webhook-drop,all: %v %v", named, err)
	}
	p.Kinds = named
	drops := 0
	for _, f := range plan(11, p) {
		if f.Kind == faultWebhookDrop {
			drops++
		}
	}
	if drops == 0 {
		t.Error("webhook-drop named but never drawn in a minute")
	}
}

// provider-slow calls outlast the lease (1.5 to 3 leases), before or after
// acting, and stay under the patient workers' deadline.
func TestPlanProviderSlowOutlastsTheLease(t *testing.T) {
	all, _ := parseFaultKinds("all")
	p := testParams(all)
	p.Window = 5 * time.Minute
	before, after := 0, 0
	for _, f := range plan(13, p) {
		if f.Kind != faultProviderSlow {
			continue
		}
		if f.Target != slowTarget || f.Amount < p.Lease*3/2 || f.Amount > slowCallMax*p.Lease || f.For < time.Second {
			t.Errorf("fault %d: %s", f.N, f)
		}
		if f.Before {
			before++
		} else {
			after++
		}
	}
	if before == 0 || after == 0 {
		t.Errorf("five minutes of provider-slow: %d before acting, %d after", before, after)
	}
	// Its own lane: without it, every other lane's plan is the same.
	without := testParams(all)
	without.Window = p.Window
	without.Kinds = map[faultKind]bool{}
	for k := range all {
		without.Kinds[k] = k != faultProviderSlow
	}
	var rest, other []fault
	for _, f := range plan(13, p) {
		if f.Kind != faultProviderSlow {
			f.N = 0
			rest = append(rest, f)
		}
	}
	for _, f := range plan(13, without) {
		f.N = 0
		other = append(other, f)
	}
	if !reflect.DeepEqual(rest, other) {
		t.Error("the provider-slow lane moved other faults")
	}
	c, err := parseFlags([]string{"--mysql-dsn", "root@tcp(127.0.0.1:3306)/"}, &strings.Builder{})
	if err != nil || c.patientTimeout != 14*time.Second || c.patientTimeout <= slowCallMax*c.lease {
		t.Errorf("default --patient-provider-timeout %s (%v), want 3.5 leases", c.patientTimeout, err)
	}
	if _, err := parseFlags([]string{"--mysql-dsn", "root@tcp(127.0.0.1:3306)/", "--patient-provider-timeout", "12s"},
		&strings.Builder{}); err == nil || !strings.Contains(err.Error(), "--patient-provider-timeout") {
		t.Errorf("a patient deadline no longer than the longest slow call: %v", err)
	}
}
