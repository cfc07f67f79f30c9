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
