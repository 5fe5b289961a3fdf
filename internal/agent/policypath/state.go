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
			k, end := e.key[:e.keyLen()], []byte(nil)
			if d.interval {
				k, end = e.key[:d.keyLen], e.key[d.keyLen:2*d.keyLen]
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
	for i := range p.sets {
		els, err := p.readSet(i)
		if err != nil {
			return nil, err
		}
		for _, e := range els {
			d := setDefs[i]
			k, end := e.key[:d.keyLen], []byte(nil)
			if d.interval {
				end = e.key[d.keyLen : 2*d.keyLen]
			}
			out = append(out, fmt.Sprintf("%s %x-%x", d.name, k, end))
		}
	}
	slices.Sort(out)
	return out, nil
}
