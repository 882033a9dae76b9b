package server

import (
	"runtime"
	"runtime/debug"
)

// modulePath is the path of this module, looked up among the build's
// dependencies when the server is linked into another program.
const modulePath = "github.com/ratelease/ratelease"

// Build describes the build of the running program, from
// runtime/debug.ReadBuildInfo. It is what rateleased -version prints and
// the ratelease_build_info metric carries.
type Build struct {
	// Version is the version of module github.com/ratelease/ratelease:
	// "v1.2.3" when built by go install module@version, a pseudo-version
	// or "(devel)" when built from a source tree, "unknown" when the
	// binary carries no build information.
	Version string
	// Revision is the VCS revision the binary was built from, with
	// "-dirty" appended when the tree had local changes; "unknown" when
	// the build did not record it (go install module@version records
	// none; the version names the code then).
	Revision string
	// GoVersion is the Go toolchain that built the binary, as "go1.26.0".
	GoVersion string
}

// ReadBuild returns the build of the running program.
func ReadBuild() Build {
	info, _ := debug.ReadBuildInfo()
	return buildOf(info)
}

// buildOf returns the Build that info describes; info nil means a binary
// without build information.
func buildOf(info *debug.BuildInfo) Build {
	b := Build{Version: "unknown", Revision: "unknown", GoVersion: runtime.Version()}
	if info == nil {
		return b
	}
	if info.GoVersion != "" {
		b.GoVersion = info.GoVersion
	}
	if info.Main.Path == modulePath {
		b.Version = info.Main.Version
	} else {
		for _, d := range info.Deps {
			if d.Path == modulePath {
				if d.Replace != nil {
					d = d.Replace
				}
				b.Version = d.Version
				break
			}
		}
	}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	modified := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified && b.Revision != "unknown" {
		b.Revision += "-dirty"
	}
	return b
}
