package selector

import (
	"sort"
	"strings"
)

// trieNode is a node of the approximate radix tree. Every node on an
// inserted path carries the endpoint that inserted it last.
type trieNode struct {
	label    string // edge label from the parent
	parent   *trieNode
	children []*trieNode
	ep       int16 // -1: none
	last     uint64
}

func (n *trieNode) child(b byte) *trieNode {
	for _, c := range n.children {
		if c.label[0] == b {
			return c
		}
	}
	return nil
}

// trie is the tier-1 approximate radix tree over request text (SGLang's
// cache-aware router idea): it remembers which endpoint last served which
// text prefix, bounded by node count with least-recently-used trimming.
// Not safe for concurrent use.
type trie struct {
	root  trieNode
	nodes int
	max   int
	tick  uint64
}

func newTrie(max int) *trie {
	t := &trie{max: max}
	t.root.ep = -1
	return t
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func trieKey(text string) string {
	if len(text) > TrieKeyMax {
		return text[:TrieKeyMax]
	}
	return text
}

// match walks text down the tree. matched is the number of bytes of text
// that follow some inserted path; ep is the endpoint of the deepest node
// reached that carries one (-1 when none).
func (t *trie) match(text string) (ep, matched int) {
	text = trieKey(text)
	ep = -1
	n, pos := &t.root, 0
	for pos < len(text) {
		c := n.child(text[pos])
		if c == nil {
			break
		}
		l := commonPrefix(c.label, text[pos:])
		pos += l
		if c.ep >= 0 {
			ep = int(c.ep)
		}
		if l < len(c.label) {
			break
		}
		n = c
	}
	return ep, pos
}

// insert records text as served by ep and trims the tree to its bound.
func (t *trie) insert(text string, ep int) {
	text = trieKey(text)
	if text == "" {
		return
	}
	t.tick++
	n, pos := &t.root, 0
	for pos < len(text) {
		c := n.child(text[pos])
		if c == nil {
			leaf := &trieNode{label: strings.Clone(text[pos:]), parent: n, ep: int16(ep), last: t.tick}
			n.children = append(n.children, leaf)
			t.nodes++
			break
		}
		l := commonPrefix(c.label, text[pos:])
		if l < len(c.label) {
			mid := &trieNode{label: c.label[:l], parent: n, children: []*trieNode{c}}
			c.label = c.label[l:]
			c.parent = mid
			for i, x := range n.children {
				if x == c {
					n.children[i] = mid
				}
			}
			t.nodes++
			c = mid
		}
		c.ep, c.last = int16(ep), t.tick
		pos += l
		n = c
	}
	if t.nodes > t.max {
		t.trim(t.max * 9 / 10)
	}
}

func (t *trie) detach(n *trieNode) {
	p := n.parent
	for i, x := range p.children {
		if x == n {
			p.children = append(p.children[:i], p.children[i+1:]...)
			break
		}
	}
	n.parent = nil
	t.nodes--
}

// trim removes least-recently-used leaves until at most target nodes remain.
func (t *trie) trim(target int) {
	var leaves []*trieNode
	for t.nodes > target {
		leaves = leaves[:0]
		t.walk(&t.root, func(n *trieNode) {
			if n != &t.root && len(n.children) == 0 {
				leaves = append(leaves, n)
			}
		})
		if len(leaves) == 0 {
			return
		}
		sort.Slice(leaves, func(i, j int) bool { return leaves[i].last < leaves[j].last })
		for _, l := range leaves {
			if t.nodes <= target {
				break
			}
			t.detach(l)
		}
	}
}

func (t *trie) walk(n *trieNode, f func(*trieNode)) {
	f(n)
	for _, c := range n.children {
		t.walk(c, f)
	}
}

// removeEndpoint forgets ep: its nodes lose their endpoint and leaves left
// without one are pruned.
func (t *trie) removeEndpoint(ep int) {
	t.walk(&t.root, func(n *trieNode) {
		if int(n.ep) == ep {
			n.ep = -1
		}
	})
	t.prune(&t.root)
}

// prune drops subtrees in which no node carries an endpoint.
func (t *trie) prune(n *trieNode) bool {
	keep := n.ep >= 0
	kids := n.children[:0]
	for _, c := range n.children {
		if t.prune(c) {
			kids = append(kids, c)
			keep = true
		} else {
			t.nodes -= t.count(c)
		}
	}
	clear(n.children[len(kids):])
	n.children = kids
	return keep
}

func (t *trie) count(n *trieNode) int {
	k := 1
	for _, c := range n.children {
		k += t.count(c)
	}
	return k
}
