package api

// Rules owned by a declarative source (--rules-file): every replica of a
// fleet loads the same file, so the file, not each replica's REST history,
// decides the rules it names, their service_id and their ep_idx values.
// docs/replicas.md has the model and which side wins.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"

	"github.com/kvgate/kvgate/pkg/config"
)

// FileRule is one rule of a rules file: the rule with its endpoints' ep_idx
// values as the file gives them, and where in the file it was (for errors).
type FileRule struct {
	Rule *config.Rule
	// Where names the rule in errors: "rules[2] (10.0.0.1:8000/tcp)".
	Where string
	// ServiceIDGiven reports whether the file fixed the rule's service_id.
	ServiceIDGiven bool
}

// ReconcileResult counts what one reconcile changed.
type ReconcileResult struct {
	// Checked is true when every rule passed the checks and the changes were
	// attempted: an error then means some changes were refused by the daemon
	// (those rules stay as they were), not that the file is wrong.
	Checked                              bool
	Created, Updated, Deleted, Unchanged int
}

// ownedLocked refuses a REST change to a rule a rules file owns: 409, in the
// API's error shape, naming the file.
func (s *Server) ownedLocked(key config.RuleKey) error {
	r, ok := s.rules[key]
	if !ok || r.Owner == "" {
		return nil
	}
	return &apiError{http.StatusConflict, fmt.Sprintf("rule %s is owned by the rules file %s: change it there (REST changes to file rules are refused on every replica)", key, r.Owner)}
}

// ReleaseOwned makes every file-owned rule a REST rule again: kvgate started
// without --rules-file, so nothing will reconcile them and REST must be able
// to change them. It returns how many rules it released.
func (s *Server) ReleaseOwned() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.rules {
		if r.Owner != "" {
			r.Owner = ""
			n++
		}
	}
	if n == 0 || s.opts.Store == nil {
		return n, nil
	}
	if err := s.opts.Store.Save(s.snapshotLocked()); err != nil {
		return n, fmt.Errorf("releasing file-owned rules: %w", err)
	}
	return n, nil
}

// reconcilePlan is what ReconcileFile will do, computed before anything
// changes so that a file the table cannot take leaves the table as it was.
type reconcilePlan struct {
	// remove are owned rules the file no longer names, or names with a new
	// identity (service_id, an ep_idx moved to another address): they go
	// first, and the latter come back as creates.
	remove []*config.Rule
	// put are the desired rules in file order, with old the rule installed
	// under the key now (nil: a create) and same true when nothing changes.
	put []plannedRule
}

type plannedRule struct {
	old, rule *config.Rule
	same      bool
}

// ReconcileFile makes the table match the rules file source: its rules are
// created or updated (a REST rule under the same key is taken over: the file
// wins), rules it owned and no longer names are deleted, and REST rules it
// does not name are left alone. Every rule is checked first (validation was
// the parser's; here service_id clashes and the address checks): if one
// fails, nothing changes and the error names the rule and the field. A
// change the daemon then refuses (a port in use) leaves that rule as it was;
// the others are applied and the error says which failed.
func (s *Server) ReconcileFile(source string, rules []FileRule) (ReconcileResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	plan, err := s.planLocked(source, rules)
	if err != nil {
		return ReconcileResult{}, err
	}
	res := ReconcileResult{Checked: true}
	var errs []error
	recreate := map[config.RuleKey]*config.Rule{}
	for _, old := range plan.remove {
		if err := s.commitLocked(old.Key(), old, nil); err != nil {
			errs = append(errs, fmt.Errorf("deleting rule %s: %w", old.Key(), err))
			continue
		}
		recreate[old.Key()] = old
		res.Deleted++
	}
	for _, p := range plan.put {
		key := p.rule.Key()
		switch {
		case p.same:
			res.Unchanged++
			continue
		case p.old == nil:
			res.Created++
		default:
			res.Updated++
		}
		if err := s.commitLocked(key, p.old, p.rule); err != nil {
			errs = append(errs, fmt.Errorf("rule %s: %w", key, err))
			s.restoreRemovedLocked(key, recreate[key])
			continue
		}
		if p.old == nil && recreate[key] != nil {
			res.Deleted-- // a renumbered rule: counted as one update
			res.Created--
			res.Updated++
		}
	}
	return res, errors.Join(errs...)
}

// restoreRemovedLocked puts back a rule removed for a recreate that the
// daemon then refused, so a failed change never loses the old rule.
func (s *Server) restoreRemovedLocked(key config.RuleKey, old *config.Rule) {
	if old == nil {
		return
	}
	err := s.commitLocked(key, nil, old)
	if err == nil {
		return
	}
	s.log.Error("a file rule whose recreate failed could not be restarted either; it is kept but not started, as a restored rule would be",
		"rule", key.String(), "err", err)
	s.installLocked(key, old)
	if s.opts.Store != nil {
		if err := s.opts.Store.Save(s.snapshotLocked()); err != nil {
			s.log.Error("saving the kept rule", "rule", key.String(), "err", err)
		}
	}
	s.metricsChanged(nil, old)
}

// planLocked checks the file's rules against the table and decides each
// change; it changes nothing.
func (s *Server) planLocked(source string, rules []FileRule) (reconcilePlan, error) {
	var plan reconcilePlan
	desired := make(map[config.RuleKey]bool, len(rules))
	reserved := map[int]config.RuleKey{} // service_ids the file fixes
	for _, fr := range rules {
		k := fr.Rule.Key()
		desired[k] = true
		if fr.ServiceIDGiven {
			reserved[fr.Rule.ServiceID] = k
		}
	}
	removed := map[config.RuleKey]bool{}
	for k, r := range s.rules {
		if r.Owner != "" && !desired[k] {
			plan.remove = append(plan.remove, r)
			removed[k] = true
		}
	}
	if len(s.rules)-len(plan.remove)+countNew(s.rules, rules) > MaxRules {
		return plan, &apiError{http.StatusBadRequest, fmt.Sprintf("rules file %s: the table would hold more than %d rules", source, MaxRules)}
	}
	taken := map[int]bool{}
	for k, r := range s.rules {
		if !removed[k] && !desired[k] {
			taken[r.ServiceID] = true // REST rules the file leaves alone
		}
	}
	for _, fr := range rules {
		p, err := s.planRuleLocked(source, fr, reserved, taken, removed)
		if err != nil {
			return plan, err
		}
		if p.old != nil && (p.rule.ServiceID != p.old.ServiceID || renumbered(p.old, p.rule)) {
			plan.remove = append(plan.remove, p.old)
			removed[p.rule.Key()] = true
			p.old = nil
		}
		taken[p.rule.ServiceID] = true
		plan.put = append(plan.put, p)
	}
	return plan, nil
}

func countNew(table map[config.RuleKey]*config.Rule, rules []FileRule) int {
	n := 0
	for _, fr := range rules {
		if _, ok := table[fr.Rule.Key()]; !ok {
			n++
		}
	}
	return n
}

// planRuleLocked decides one file rule: its service_id, its checks, and
// whether it changes anything.
func (s *Server) planRuleLocked(source string, fr FileRule, reserved map[int]config.RuleKey, taken map[int]bool,
	removed map[config.RuleKey]bool) (plannedRule, error) {
	r := fr.Rule.Clone()
	r.Owner = source
	k := r.Key()
	old := s.rules[k]
	switch {
	case fr.ServiceIDGiven:
		if taken[r.ServiceID] {
			return plannedRule{}, &config.ValidationError{Field: "serviceArguments.service_id",
				Msg: fmt.Sprintf("%s: serviceArguments.service_id: %d is used by a rule the file does not name; pick another or delete that rule", fr.Where, r.ServiceID)}
		}
	case old != nil && reservedBy(reserved, old.ServiceID, k):
		r.ServiceID = old.ServiceID
	default:
		r.ServiceID = freeServiceID(reserved, taken, s.rules, k)
	}
	r.NextIdx = nextIdxAfter(r, old)
	// The same confinement as a POST: a file rule's backendTokenFile must lie
	// in --backend-token-dir.
	if err := s.checkBackendTokenFile(r); err != nil {
		return plannedRule{}, prefixed(fr.Where, err)
	}
	if err := config.CheckAddresses(r, s.listenersExceptLocked(k, removed)); err != nil {
		return plannedRule{}, prefixed(fr.Where, err)
	}
	if err := config.CheckEndpointCIDRs(r, s.opts.EndpointCIDRs); err != nil {
		return plannedRule{}, prefixed(fr.Where, err)
	}
	if old != nil {
		if err := config.CheckUpdate(old, r); err != nil {
			return plannedRule{}, prefixed(fr.Where, err)
		}
	}
	return plannedRule{old: old, rule: r, same: old != nil && sameRule(old, r)}, nil
}

// reservedBy reports whether service_id id is free for the rule under k: no
// other file rule fixes it.
func reservedBy(reserved map[int]config.RuleKey, id int, k config.RuleKey) bool {
	owner, ok := reserved[id]
	return !ok || owner == k
}

// freeServiceID is the lowest service_id no rule holds, no file rule fixes
// and this reconcile has not handed out; a rule keeps its own id.
func freeServiceID(reserved map[int]config.RuleKey, taken map[int]bool, table map[config.RuleKey]*config.Rule, k config.RuleKey) int {
	used := map[int]bool{}
	for tk, r := range table {
		if tk != k {
			used[r.ServiceID] = true
		}
	}
	for id := 1; ; id++ {
		if _, res := reserved[id]; !res && !taken[id] && !used[id] {
			return id
		}
	}
}

// nextIdxAfter keeps the never-reuse promise of ep_idx across file edits:
// one past the highest index the rule has used or uses now.
func nextIdxAfter(r, old *config.Rule) int {
	next := 0
	if old != nil {
		next = old.NextIdx
	}
	for _, e := range r.Endpoints {
		next = max(next, e.Idx+1)
	}
	return next
}

// renumbered reports whether an update would move an ep_idx to another
// address or give an address another ep_idx: the daemon matches endpoints by
// address with a stable index, so such a change is a delete and a create.
func renumbered(old, r *config.Rule) bool {
	for _, e := range r.Endpoints {
		if prev, ok := old.EndpointByKey(e.Key()); ok && prev.Idx != e.Idx {
			return true
		}
		if prev, ok := old.Endpoint(e.Idx); ok && prev.Key() != e.Key() {
			return true
		}
	}
	return false
}

func sameRule(a, b *config.Rule) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(ja, jb)
}

// prefixed puts where in front of a check's message, keeping its type (so
// the status stays 400 or 409).
func prefixed(where string, err error) error {
	var ve *config.ValidationError
	var ce *config.ConflictError
	switch {
	case errors.As(err, &ve):
		return &config.ValidationError{Field: ve.Field, Msg: where + ": " + ve.Msg}
	case errors.As(err, &ce):
		return &config.ConflictError{Msg: where + ": " + ce.Msg}
	}
	return fmt.Errorf("%s: %w", where, err)
}

// listenersExceptLocked is listenersLocked without the rules this reconcile
// removes, whose VIPs will be free by the time key's rule is installed.
func (s *Server) listenersExceptLocked(key config.RuleKey, removed map[config.RuleKey]bool) config.Listeners {
	l := s.listenersLocked(key)
	if len(removed) == 0 {
		return l
	}
	gone := map[netip.AddrPort]bool{}
	for k := range removed {
		if a, err := netip.ParseAddr(k.ExternalIP); err == nil && k != key {
			gone[netip.AddrPortFrom(a.Unmap(), uint16(k.Port))] = true
		}
	}
	kept := l.VIPs[:0]
	for _, v := range l.VIPs {
		if !gone[v] {
			kept = append(kept, v)
		}
	}
	l.VIPs = kept
	return l
}
