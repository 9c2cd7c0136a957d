package admin

import "runtime/debug"

// modulePath is this module's path, looked up in the running binary's build
// info.
const modulePath = "github.com/pgbaton/pgbaton/admin"

// moduleVersion is the version of this module linked into the running
// binary: a tag such as v1.2.0 when built with `go install` or as a
// dependency, "(devel)" from a checkout.
func moduleVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if bi.Main.Path == modulePath {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == modulePath {
			if d.Replace != nil && d.Replace.Version != "" {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return "(devel)"
}

// revision is the VCS commit the running binary was built from, "" when
// the build did not record one (go install, -buildvcs=false).
func revision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}
