# attacks: a 2,000-digit number made at run time from a string, then squared (exact big-integer product)
# expect: deny
package wb.admission

digits := concat("", ["9" | some _ in numbers.range(1, 2000)])

deny contains "never" if to_number(digits) * to_number(digits) < 0
