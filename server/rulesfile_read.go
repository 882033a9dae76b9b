package server

import "fmt"

// ReadRulesFile decodes and validates a rules file, as ParseRules does, and
// returns it as written (the ratelease CLI sends its rules and clients to
// the admin API). Errors wrap leases.ErrInvalidRules and name the rule or
// client and the field at fault.
func ReadRulesFile(data []byte) (*RulesFile, error) {
	if _, err := ParseRules(data); err != nil {
		return nil, err
	}
	var f RulesFile
	if err := decodeYAMLStrict(data, &f); err != nil {
		return nil, fmt.Errorf("decode rules file: %w", err)
	}
	return &f, nil
}
