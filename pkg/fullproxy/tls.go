package fullproxy

import "strings"

// forwardedProtoHeader tells an engine behind a TLS rule that its client
// spoke https, as LoxiLB does for TLS clients.
const forwardedProtoHeader = "X-Forwarded-Proto"

// forwardedProto adds X-Forwarded-Proto: https to set and drops any
// client-sent X-Forwarded-Proto (and an earlier value in set), copying
// rather than changing the caller's map and slice.
func forwardedProto(drop map[string]bool, set []HeaderField) (map[string]bool, []HeaderField) {
	d := make(map[string]bool, len(drop)+1)
	for k, v := range drop {
		d[k] = v
	}
	d["x-forwarded-proto"] = true
	out := make([]HeaderField, 0, len(set)+1)
	for _, h := range set {
		if !strings.EqualFold(h.Name, forwardedProtoHeader) {
			out = append(out, h)
		}
	}
	return d, append(out, HeaderField{Name: forwardedProtoHeader, Value: "https"})
}
