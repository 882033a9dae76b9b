package protocol

import "fmt"

// Priority classes of a request, highest first. A rule may reserve a share
// of each of its limits for the classes above a request's (see
// leases.Rule.Reserve): under saturation the lower classes are denied first
// and the higher ones keep getting tokens. The empty string is
// PriorityNormal.
const (
	// PriorityCritical is the highest class: no share is ever kept from it.
	PriorityCritical = "critical"
	// PriorityHigh is the class below critical.
	PriorityHigh = "high"
	// PriorityNormal is the default class of a request that names none.
	PriorityNormal = "normal"
	// PriorityLow is the lowest class, for best-effort work.
	PriorityLow = "low"
)

// Priorities lists the priority classes, highest first; a class's rank is
// its index.
var Priorities = []string{PriorityCritical, PriorityHigh, PriorityNormal, PriorityLow}

// PriorityRank returns the rank of class p (0 for critical, the highest,
// to 3 for low) and whether p is a class. The empty string is normal.
func PriorityRank(p string) (int, bool) {
	switch p {
	case PriorityCritical:
		return 0, true
	case PriorityHigh:
		return 1, true
	case PriorityNormal, "":
		return 2, true
	case PriorityLow:
		return 3, true
	}
	return 0, false
}

// ValidatePriority returns nil when p is a priority class or empty, and
// otherwise an error that lists the classes.
func ValidatePriority(p string) error {
	if _, ok := PriorityRank(p); ok {
		return nil
	}
	return fmt.Errorf("%q is not a priority class (critical, high, normal or low)", p)
}
