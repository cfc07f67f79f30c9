package gateway

// EndpointActive implements api.HealthSource: an endpoint the active probe
// marked down shows as "state":"inactive" in GET /netlox/v1/config/loadbalancer/all.
func (g *Gateway) EndpointActive(serviceID, epIdx int) (active, known bool) {
	g.mu.Lock()
	rt, ok := g.rules[serviceID]
	g.mu.Unlock()
	if !ok || rt.health == nil {
		return false, false
	}
	return !rt.health.States().ProbeDown.Has(epIdx), true
}

// ProbeError is why an endpoint's last probe failed ("" none), for the
// status page's endpoint_down problem.
func (g *Gateway) ProbeError(serviceID, epIdx int) string {
	g.mu.Lock()
	rt, ok := g.rules[serviceID]
	g.mu.Unlock()
	if !ok || rt.health == nil {
		return ""
	}
	return rt.health.tracker.Load().ProbeError(epIdx)
}
