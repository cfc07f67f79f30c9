package config

// EndpointDiff is what an update does to a rule's endpoints, matched by
// identity (ip:port). Endpoints in Kept have the same ep_idx in both rules.
type EndpointDiff struct {
	Added   []Endpoint // in the new rule only
	Removed []Endpoint // in the old rule only
	Kept    []Endpoint // in both (the new rule's copy, which may differ in weight, role, admin …)
}

// DiffEndpoints compares the endpoints of two versions of a rule. old or
// updated may be nil (create, delete).
func DiffEndpoints(old, updated *Rule) EndpointDiff {
	var d EndpointDiff
	if updated != nil {
		for _, e := range updated.Endpoints {
			if old != nil {
				if _, ok := old.EndpointByKey(e.Key()); ok {
					d.Kept = append(d.Kept, e)
					continue
				}
			}
			d.Added = append(d.Added, e)
		}
	}
	if old != nil {
		for _, e := range old.Endpoints {
			if updated == nil {
				d.Removed = append(d.Removed, e)
				continue
			}
			if _, ok := updated.EndpointByKey(e.Key()); !ok {
				d.Removed = append(d.Removed, e)
			}
		}
	}
	return d
}

// SubscriberDiff is the KV-event subscribers to start and stop for a rule
// change: the daemon keeps the subscribers (and inventories) of Keep, stops
// Stop and starts Start. Subscribers follow KVEndpoints (prefill endpoints in
// mode 1, all in mode 3).
type SubscriberDiff struct {
	Start, Stop, Keep []Endpoint
}

// DiffSubscribers says which subscribers a rule change starts, stops and
// keeps. A change to what a subscriber dials (kvZmqPort, kvDpRankCount,
// kvReplayPort, kvEngineType) restarts every subscriber of the rule; an
// endpoint whose role changes in or out of the scored set is started or
// stopped; admin and probe state never stop a subscriber.
func DiffSubscribers(old, updated *Rule) SubscriberDiff {
	var d SubscriberDiff
	var before, after []Endpoint
	if old != nil {
		before = old.KVEndpoints()
	}
	if updated != nil {
		after = updated.KVEndpoints()
	}
	restartAll := old != nil && updated != nil &&
		(old.ZmqPort() != updated.ZmqPort() || old.DpRankCount() != updated.DpRankCount() ||
			old.Args.KVReplayPort != updated.Args.KVReplayPort || old.EffectiveEngine() != updated.EffectiveEngine())
	inBefore := make(map[string]bool, len(before))
	for _, e := range before {
		inBefore[e.Key()] = true
	}
	inAfter := make(map[string]bool, len(after))
	for _, e := range after {
		inAfter[e.Key()] = true
	}
	for _, e := range before {
		if restartAll || !inAfter[e.Key()] {
			d.Stop = append(d.Stop, e)
		}
	}
	for _, e := range after {
		switch {
		case restartAll || !inBefore[e.Key()]:
			d.Start = append(d.Start, e)
		default:
			d.Keep = append(d.Keep, e)
		}
	}
	return d
}
