# attacks: glob.match with a pattern of a million characters on an empty text: its regular expression compiled to a million instructions, twice, before the work check refused it
# expect: deny
package wb.admission

a0 := "?a?a?a?a?a?a?a?a"

a1 := concat("", [a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0, a0])

a2 := concat("", [a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1, a1])

a3 := concat("", [a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2, a2])

pattern := concat("", [a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3, a3])

deny contains "answered in time" if not glob.match(pattern, [], "")
