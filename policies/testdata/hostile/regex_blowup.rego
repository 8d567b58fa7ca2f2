# attacks: regex.replace expanding every match many times over, and regex.find_n / split on a big string
# expect: deny
package wb.admission

big := replace("0123456789abcdef0123456789abcdef", "", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")

wide := regex.replace(big, "(.+)", "$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1")

wider := regex.replace(wide, "(.+)", "$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1$1")

pieces := regex.find_n(".", wider, -1)

deny contains "never" if {
	count(pieces) < 0
	regex.match("^(a+)+$", wider)
}
