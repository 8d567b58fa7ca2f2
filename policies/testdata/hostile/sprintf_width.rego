# attacks: sprintf with a 1,000,000-wide field for each of 100,000 numbers (100 GB of padding)
# expect: deny
package wb.admission

deny contains s if {
	some i in numbers.range(1, 100000)
	s := sprintf("%1000000[1]d", [i])
}
