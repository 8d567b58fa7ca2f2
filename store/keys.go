package store

import "wb/session"

// keys names every Redis key of one project. The {project} hash tag puts them in one slot.
type keys struct{ p string }

func projectKeys(project string) keys { return keys{"wb:{" + project + "}:"} }

func (k keys) session(id string) string        { return k.p + "s:" + id }
func (k keys) all() string                     { return k.p + "all" }
func (k keys) byState(s session.State) string  { return k.p + "st:" + string(s) }
func (k keys) byEndUser(endUser string) string { return k.p + "eu:" + endUser }
func (k keys) active() string                  { return k.p + "active" }

// Outbox is the project's event stream: every transition appends to it in the same script.
func Outbox(project string) string { return projectKeys(project).p + "outbox" }

// placing is the project's placement lock; placeAgain asks its holder for another round.
func (k keys) placing() string    { return k.p + "placing" }
func (k keys) placeAgain() string { return k.p + "placing:again" }
