package main

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/spf13/cobra"
)

// newSetEndpointCmd is `kvctl set endpoint IP --tcp=PORT --ep=EPIP:EPPORT --admin=down|up`.
func newSetEndpointCmd() *cobra.Command {
	var tcp, ep, admin string
	c := &cobra.Command{
		Use:   "endpoint EXTERNAL-IP --tcp=PORT --ep=EPIP:EPPORT --admin=down|up",
		Short: "Set an endpoint administratively down or up without deleting the rule",
		Long: `Set one endpoint of a rule administratively down (never selected; it keeps its
KV inventory and subscriber, so it comes back warm) or up again. The state is
persisted and survives re-posting the rule without an admin field.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ip, port, _, err := ruleAddress("set endpoint", args[0], tcp, false)
			if err != nil {
				return err
			}
			if ep == "" || admin == "" {
				return badInput("set endpoint: --ep=EPIP:EPPORT and --admin=down|up are required")
			}
			host, p, ok := splitHostPart(ep)
			if !ok {
				return badInput("--ep %q: want EPIP:EPPORT", ep)
			}
			epIP, err := parseIP("--ep", host)
			if err != nil {
				return err
			}
			epPort, err := strconv.Atoi(p)
			if err != nil || epPort < 1 || epPort > 65535 {
				return badInput("--ep %q: EPPORT must be 1-65535", ep)
			}
			if admin != "up" && admin != "down" {
				return badInput("--admin %q: allowed values: up, down", admin)
			}
			body := map[string]any{"endpointIP": epIP, "targetPort": epPort, "admin": admin}
			if _, err := callAPI(cmd, http.MethodPut, rulePath(ip, port)+"/endpoint", body); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Success: endpoint %s of rule %s:%d/tcp is admin %s\n", ep, ip, port, admin)
			return nil
		},
	}
	c.Flags().StringVar(&tcp, "tcp", "", "the rule's PORT")
	c.Flags().StringVar(&ep, "ep", "", "the endpoint as EPIP:EPPORT (IPv6 as [EPIP]:EPPORT)")
	c.Flags().StringVar(&admin, "admin", "", "down or up")
	return c
}
