# attacks: strings.render_template with nested ranges: output grows as n^depth, inside one call
# expect: compile_error
package wb.admission

xs := numbers.range(1, 1000)

deny contains s if {
	s := strings.render_template("{{range .xs}}{{range .xs}}{{range .xs}}0123456789{{end}}{{end}}{{end}}", {"xs": xs})
}
