package policypath

import (
	"fmt"
	"slices"
)

// Want lists the elements the kernel must hold for pods, one string per
// element ("set key[-end]" in hex), sorted: tests compare it with Kernel.
func Want(pods map[string]*Pod) []string {
	var out []string
	for _, pod := range pods {
		for _, e := range elementsOf(pod) {
			d := setDefs[e.set]
			k, end := e.key, ""
			if d.interval {
				k, end = e.key[:d.keyLen], e.key[d.keyLen:]
			}
			out = append(out, fmt.Sprintf("%s %x-%x", d.name, k, end))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Kernel reads the policy sets back from the kernel, in Want's form.
func (p *Path) Kernel() ([]string, error) {
	var out []string
	for i, s := range p.sets {
		els, err := p.conn.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("policypath: read set %s: %w", s.Name, err)
		}
		for _, el := range els {
			if el.IntervalEnd {
				continue
			}
			out = append(out, fmt.Sprintf("%s %x-%x", setDefs[i].name, el.Key, el.KeyEnd))
		}
	}
	slices.Sort(out)
	return out, nil
}
