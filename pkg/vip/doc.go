// Package vip puts each rule's VIP on a network device while the rule exists,
// so the VIP answers without an operator adding the address by hand.
//
// kvgate binds rule listeners with IP_FREEBIND, so a listener works before its
// address is plumbed; with --vip-dev DEV the Plumber adds the VIP to DEV as a
// /32 (IPv4) or /128 (IPv6) through netlink when the first rule on that
// address starts, and removes it when the last such rule is deleted and at
// exit. It never removes an address it did not add: an address already on the
// device when a rule claims it is the operator's and stays.
//
// Ownership survives a crash: the addresses the Plumber added are recorded in
// <state-dir>/vips.json before they are added (IPv6 has no address labels to
// mark them on the device). After a restart, Open reads the record, the
// persisted rules claim their VIPs again, and Prune removes the recorded
// addresses that no rule claimed. docs/vip.md has the operator's view.
//
// Knobs: --vip-dev (off by default), --vip-garp (announce each VIP when
// added: gratuitous ARP for IPv4, unsolicited neighbour advertisement for IPv6). Metrics: kvgate_vip_addresses{owner} through the
// Observer.
package vip
